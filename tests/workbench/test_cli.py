"""The command line: verbs, JSON output, and usage errors instead of tracebacks."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_usage_error

from workbench.cli import main


@pytest.mark.slow
def test_help_lists_the_verbs():
    out = subprocess.run([sys.executable, "-m", "workbench.cli", "--help"], capture_output=True, text=True, check=True)
    for verb in ("demo", "generate", "export", "presets"):
        assert verb in out.stdout


def test_generate_writes_json(tmp_path, capsys):
    out = tmp_path / "gen.json"
    main(
        [
            "generate",
            "fbt:debug",
            "--prompt",
            "12+7=",
            "--prompt",
            "3*4=",
            "--regimes",
            "standard,soft,fused",
            "--passes",
            "exact",
            "--max-new-tokens",
            "6",
            "--json",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert set(result["generations"]) == {"standard", "soft", "fused"}
    assert all(len(texts) == 2 for texts in result["generations"].values())
    assert "[soft] '12+7='" in capsys.readouterr().out


def test_export_from_a_saved_run(tmp_path):
    from workbench import build_model, save_model

    run = save_model(build_model("baseline", "debug"), tmp_path / "run")
    main(["export", str(run), str(tmp_path / "hf"), "--json", str(tmp_path / "export.json")])
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "export.json").read_text())["exact"] is True


@pytest.mark.parametrize(
    "argv,match",
    [
        (["generate", "gpt:debug", "--prompt", "x"], "unknown architecture 'gpt'"),
        (["generate", "fbt:huge", "--prompt", "x"], "unknown preset 'huge'"),
        (["generate", "nowhere", "--prompt", "x"], r"nowhere: no such run directory \(expected a run directory or ARCH:PRESET"),
        (["generate", "baseline:debug", "--prompt", "x", "--regimes", "soft"], "needs a Full-Bandwidth model"),
        (
            ["generate", "fbt:debug", "--prompt", "x", "--passes", "two"],
            "--passes: expected a positive integer or 'exact', got 'two'",
        ),
        (["generate", "fbt:debug", "--prompt", "x", "--max-new-tokens", "500"], "n_ctx=128"),
    ],
)
def test_bad_arguments_are_usage_errors(argv, match, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(match, err), err


@pytest.mark.slow
def test_train_then_eval_from_the_cli(tmp_path):
    run = tmp_path / "run"
    main(
        [
            "train",
            "--arch",
            "fbt",
            "--preset",
            "debug",
            "--task",
            "modsum",
            "--out",
            str(run),
            "--no-progress",
            "--set",
            "train.steps=4",
            "--set",
            "train.batch_size=4",
            "--set",
            "train.seq_len=32",
            "--set",
            "data.n_train=100",
            "--set",
            "train.eval_examples=4",
        ]
    )
    main(["eval", str(run)])  # the run's own configuration
    assert json.loads((run / "results" / "eval.json").read_text())["fused_passes"] == 2
    main(["eval", str(run), "--passes", "exact"])  # another configuration: its own file
    exact = (run / "results" / "eval_passes-exact.json").read_text()
    result = json.loads(exact)
    assert result["fused_passes"] == "exact" and set(result["tasks"]) == {"modsum"}
    main(["eval", str(run), "--passes", "exact", "--n", "3", "--task", "chain"])
    assert json.loads((run / "results" / "eval_passes-exact_n-3_task-chain.json").read_text())["n_examples"] == 3
    main(["eval", str(run)])  # the run's own configuration again: refreshes eval.json
    assert json.loads((run / "results" / "eval.json").read_text())["fused_passes"] == 2
    assert (run / "results" / "eval_passes-exact.json").read_text() == exact  # untouched by it


@pytest.mark.parametrize(
    "argv,match",
    [
        (["train", "--arch", "hd", "--task", "sudoku", "--out", "x"], "task='sudoku'"),
        (["train", "--arch", "fbt", "--out", "x", "--set", "train.lr=-1"], "lr=-1.0"),
        (["train", "--arch", "fbt", "--out", "x", "--set", "train.lr"], "malformed override 'train.lr'"),
        (["train", "--arch", "hd", "--out", "x", "--set", "hd.streams=4,2", "--set", "hd.expand_at=0,9"], "increasing"),
        (["train", "--arch", "fbt", "--out", "x", "--resume"], "x/config.json"),
        (["eval", "nowhere"], "nowhere: no such run directory"),
        (["zoo", "--preset", "huge"], "invalid choice: 'huge'"),
    ],
)
def test_bad_training_arguments_are_usage_errors(argv, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(match, err), err
    assert not (tmp_path / "x").exists()


def test_app_without_streamlit_names_the_extra(monkeypatch):
    """The app is an install extra: without streamlit, ``workbench app`` says which, before starting
    anything and before it looks at the port (here one that is taken, as 8501 is while an app runs)."""
    import importlib.util
    import socket

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert_usage_error(["app", "--runs", ".", "--port", port], "streamlit is not installed", "pip install -e '.[app]'")


def test_resume_refuses_flags_it_would_ignore(tmp_path):
    """--resume continues the saved config: a --task, --preset, --set, --init-from or another
    --arch used to be ignored silently; each is now named before anything is touched. --set of a
    field that says how the run executes (engine, device, compile, checkpointing) is allowed."""
    from helpers import FAST, assert_usage_error

    run = tmp_path / "run"
    main(
        [
            "train",
            "--arch",
            "fbt",
            "--out",
            str(run),
            *[a for s in [*FAST, "train.steps=2"] for a in ("--set", s)],
            "--no-progress",
        ]
    )
    before = (run / "model.safetensors").read_bytes()
    for extra, named in [
        (["--task", "chain"], "--task"),
        (["--preset", "tiny"], "--preset"),
        (["--set", "train.lr=1e-4"], "--set train.lr would change what the run computes"),
        (["--arch", "hd"], "holds an 'fbt' run, not --arch 'hd'"),
    ]:
        assert_usage_error(["train", "--resume", "--out", str(run), *extra], named)
    assert (run / "model.safetensors").read_bytes() == before
    main(["train", "--resume", "--arch", "fbt", "--out", str(run), "--no-progress"])  # the same arch is fine
    main(["train", "--resume", "--set", "train.checkpoint_blocks=true", "--out", str(run), "--no-progress"])  # how it runs
    assert json.loads((run / "config.json").read_text())["train"]["checkpoint_blocks"] is True  # recorded


def test_help_imports_neither_torch_nor_transformer_lens():
    """``workbench --help`` and every ``VERB --help`` build the parser only: they must not pay for
    importing torch and TransformerLens (seconds; 7.1 s before the imports were made lazy)."""
    import subprocess
    import sys

    from workbench.cli import build_parser

    verbs = list(build_parser()._subparsers._group_actions[0].choices)
    script = (
        "import sys, contextlib, io\n"
        "from workbench.cli import main\n"
        f"for argv in [['--help']] + [[v, '--help'] for v in {verbs!r}]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "print(sorted(m for m in ('torch', 'transformer_lens', 'sklearn', 'streamlit') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_shows_every_options_default():
    """``--help`` names each option's default: appended to its help, or already in it."""
    import argparse

    from workbench.cli import build_parser
    from workbench.training.zoo import SCALES

    verbs = build_parser()._subparsers._group_actions[0].choices
    probe = " ".join(verbs["probe"].format_help().split())  # unwrapped
    assert "(default: 400)" in probe and "(default: 0)" in probe and "(default: 2,3)" in probe
    assert "False" not in probe  # flags have no default to show
    for name, parser in verbs.items():
        for action in parser._actions:
            if not action.option_strings or argparse.SUPPRESS in (action.help, action.default) or action.default in (None, False):
                continue
            assert "default" in (action.help or ""), (name, action.option_strings)
    for dest in ("threads", "jobs"):  # spelled in the parser to keep torch out of it
        text = next(a.help for a in verbs["zoo"]._actions if a.dest == dest)
        assert text.endswith("default: " + ", ".join(f"{k} {v[dest]}" for k, v in SCALES.items())), dest
    from workbench.probing.study import N_SEQUENCES

    assert next(a.default for a in verbs["probe"]._actions if a.dest == "n") == N_SEQUENCES


@pytest.mark.parametrize(
    "verb,old,new",
    [
        ("probe", "--n-sequences", "--n"),
        ("cache", "--n-sequences", "--n"),
        ("traces", "--n-problems", "--n"),
        ("generate", "--regime", "--regimes"),
        ("bench", "--out", "--json"),
        ("gpu-check", "--out", "--json"),
    ],
)
def test_an_old_option_spelling_still_works_and_names_the_new_one(verb, old, new, capsys):
    """One convention per concept (counts are --n, regimes --regimes, a JSON file --json, --out a
    directory); the old spellings parse into
    the same destination for one release, hidden from --help, with a warning naming the new one."""
    from workbench.cli import build_parser

    parser = build_parser()
    required = {
        "probe": ["RUN", "--target", "memory"],
        "cache": ["RUN", "--hooks", "x", "--out", "o"],
        "traces": ["RUN", "--out", "o"],
        "generate": ["M", "--prompt", "p"],
        "bench": [],
        "gpu-check": [],
    }[verb]
    value = {"--regimes": "standard,soft", "--json": "report.json"}.get(new, "7")
    old_args = parser.parse_args([verb, *required, old, value])
    warning = capsys.readouterr().err
    new_args = parser.parse_args([verb, *required, new, value])
    assert vars(old_args) == vars(new_args)
    assert warning.strip() == f"workbench: {old} is deprecated and will be removed: use {new}"
    shown = parser._subparsers._group_actions[0].choices[verb].format_help().replace("[", " ").replace("]", " ").split()
    assert old not in shown and new in shown


def test_every_passes_option_takes_k_the_same_way(capsys):
    """--passes is K of a K-pass prefill in every verb, an integer or 'exact'; the probe sweep takes
    several, comma-separated, and refuses what it cannot read before any work."""
    from workbench.cli import build_parser

    parser = build_parser()
    required = {
        "generate": ["M", "--prompt", "p"],
        "eval": ["RUN"],
        "cache": ["RUN", "--hooks", "x", "--out", "o"],
        "traces": ["RUN", "--out", "o"],
    }
    for verb, argv in required.items():
        assert parser.parse_args([verb, *argv, "--passes", "exact"]).passes == "exact"
        assert parser.parse_args([verb, *argv, "--passes", "3"]).passes == 3
    probe = ["probe", "RUN", "--target", "memory"]
    assert parser.parse_args([*probe, "--passes", "2,exact"]).passes == [2, "exact"]
    assert parser.parse_args([*probe, "--passes", "exact"]).passes == ["exact"]
    assert parser.parse_args(probe).passes == [2, 3]
    for bad in ("0,exact", "exact,x", ""):
        with pytest.raises(SystemExit):
            parser.parse_args([*probe, "--passes", bad])
        assert "expected comma-separated pass counts >= 1 or 'exact'" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["generate", "eval", "cache", "probe", "dynamics", "traces"])
def test_every_analysis_verb_takes_a_device_and_threads_and_checks_them_first(verb, tmp_path):
    """--device and --threads on every analysis verb; a device this machine lacks, a name torch
    does not know or no threads are refused in one line before anything is read or written."""
    import torch

    from workbench.cli import build_parser

    argv = {
        "generate": ["fbt:debug", "--prompt", "p"],
        "eval": [str(tmp_path / "run")],
        "cache": ["fbt:debug", "--hooks", "hook_embed", "--out", str(tmp_path / "store")],
        "probe": [str(tmp_path / "run"), "--target", "memory"],
        "dynamics": [str(tmp_path / "run"), "--out", str(tmp_path / "dyn")],
        "traces": [str(tmp_path / "run"), "--out", str(tmp_path / "traces")],
    }[verb]
    (tmp_path / "run").mkdir()  # a run by its config (the device is refused before it is read further)
    (tmp_path / "run" / "config.json").write_text('{"arch": "fbt"}')
    args = build_parser().parse_args([verb, *argv])
    assert (args.device, args.threads) == ("cpu", None)
    if not torch.cuda.is_available():
        assert_usage_error([verb, *argv, "--device", "cuda"], "--device 'cuda'", "CUDA device")
    assert_usage_error([verb, *argv, "--device", "tpu"], "--device 'tpu'", "expected cpu, cuda or cuda:N")
    assert_usage_error([verb, *argv, "--threads", "0"], "--threads 0", "expected 1 or more")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and [p.name for p in (tmp_path / "run").iterdir()] == [
        "config.json"
    ]


def test_an_analysis_verb_runs_on_the_device_and_threads_it_is_given(tmp_path):
    import torch
    from helpers import cli

    before = torch.get_num_threads()
    try:
        code, out, err = cli(
            ["generate", "fbt:debug", "--prompt", "ab", "--max-new-tokens", "2", "--device", "cpu", "--threads", "1"]
        )
        assert code is None, err
        assert torch.get_num_threads() == 1 and "[standard] 'ab'" in out
    finally:
        torch.set_num_threads(before)


def test_the_app_on_a_busy_port_is_refused_naming_the_port_before_any_server_starts(tmp_path, capsys, monkeypatch):
    """A second ``workbench app`` on a port something listens on exits 2 with one line
    naming ``--port``, and starts no server."""
    import socket
    import subprocess

    from workbench.cli import main

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main(["app", "--runs", str(tmp_path), "--port", str(port)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--port {port}: 127.0.0.1:{port} is not free" in err and not started
    assert len(err.strip().splitlines()) == 1


def test_every_verb_refuses_a_bad_run_or_regime_before_any_work(tmp_path, capsys, monkeypatch):
    """A wrong path, a regime that does not exist or that the run cannot decode in, a
    non-FBT run for dynamics: each exits 2 with one line naming the value, before the verb's work
    starts (every verb's function is replaced by one that fails the test if called) and in well
    under a second."""
    import time

    from workbench.cli import GROUPS

    for group in GROUPS:
        for name in dir(group):
            if name.startswith("cmd_"):
                monkeypatch.setattr(group, name, lambda args: pytest.fail(f"workbench {args.verb} started its work"))
    runs = {}
    for arch in ("baseline", "fbt"):
        (tmp_path / arch).mkdir()
        (tmp_path / arch / "config.json").write_text(json.dumps({"arch": arch}))
        runs[arch] = str(tmp_path / arch)
    (tmp_path / "file").write_text("not a run")
    missing = str(tmp_path / "nowhere")
    cases = [
        (["generate", runs["fbt"], "--prompt", "x", "--regimes", "standard,sof"], "invalid regimes 'standard,sof'"),
        (["generate", runs["baseline"], "--prompt", "x", "--regimes", "standard,fused"], "decodes in the standard regime only"),
        (["generate", missing, "--prompt", "x"], f"{missing}: no such run directory"),
        (["export", missing, str(tmp_path / "out")], "no such run directory"),
        (["eval", missing], "no such run directory"),
        (["eval", "fbt:debug"], "fbt:debug: no such run directory"),  # a fresh model is no run to evaluate
        (["cache", missing, "--hooks", "x", "--out", str(tmp_path / "c")], "no such run directory"),
        (["probe", str(tmp_path / "file"), "--target", "memory"], "not a run directory"),
        (["dynamics", runs["fbt"], runs["baseline"], "--out", str(tmp_path / "d")], "dynamics analyses FBT runs"),
        (["traces", runs["baseline"], missing, "--out", str(tmp_path / "t")], "no such run directory"),
        (["traces", runs["fbt"], "--regimes", "fused,bogus", "--out", str(tmp_path / "t")], "invalid regimes"),
    ]
    for argv, message in cases:
        started = time.perf_counter()
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err, (argv, err)
        assert time.perf_counter() - started < 1.0, argv


def test_the_dynamics_defaults_are_one_set_for_the_cli_and_the_library():
    """One default per setting (the app's page reads the same set: tests/app)."""
    import inspect

    from workbench.cli import build_parser
    from workbench.dynamics.defaults import DEFAULTS
    from workbench.dynamics.study import analyse_run

    args = build_parser().parse_args(["dynamics", "RUN", "--out", "D"])
    flags = {"n_spectra": "spectra", "n_fixed": "fixed_points", "n_starts": "starts"}
    assert {k: getattr(args, flags.get(k, k)) for k in DEFAULTS} == DEFAULTS
    signature = inspect.signature(analyse_run).parameters
    assert {k: signature[k].default for k in DEFAULTS} == DEFAULTS


def test_runs_sharing_a_directory_name_need_names_before_any_work(tmp_path):
    for where in ("a", "b"):
        (tmp_path / where / "fbt").mkdir(parents=True)
        (tmp_path / where / "fbt" / "config.json").write_text('{"arch": "fbt"}')
    runs = [str(tmp_path / "a" / "fbt"), str(tmp_path / "b" / "fbt")]
    assert_usage_error(["dynamics", *runs, "--out", str(tmp_path / "d")], "two runs share the name fbt", "--names")
    assert_usage_error(["traces", *runs, "--out", str(tmp_path / "t")], "two runs share the name fbt")
    assert_usage_error(["traces", *runs, "--names", "x", "--out", str(tmp_path / "t")], "expected one non-empty name per run (2)")
    assert not (tmp_path / "d").exists() and not (tmp_path / "t").exists()


def test_dynamics_and_traces_write_beside_the_first_run_by_default():
    """``--out`` optional with one rule, as ``probe``'s (the run's ``results/``): the first
    run's ``results/VERB``, and ``results/VERB-with-OTHERS`` for several (by their names)."""
    from workbench.cli import build_parser, default_out

    parser = build_parser()
    for verb in ("dynamics", "traces"):
        args = parser.parse_args([verb, "zoo/fbt"])
        default_out(args, verb)
        assert args.out == f"zoo/fbt/results/{verb}"
        args = parser.parse_args([verb, "zoo/fbt", "zoo/fbt-seed1", "other/fbt", "--names", "fbt", "fbt-seed1", "other/fbt"])
        default_out(args, verb)
        assert args.out == f"zoo/fbt/results/{verb}-with-fbt-seed1-other-fbt"
        args = parser.parse_args([verb, "zoo/fbt", "--out", "elsewhere"])
        default_out(args, verb)
        assert args.out == "elsewhere"


def test_the_dynamics_analysis_tells_each_phase_its_own_count(tmp_path):
    """The bar stood at 97% (301/309 units) for 14 minutes, a spectrum or a fixed-point
    search counting as one rollout step; each phase is now its own count, told piece by piece to
    its total, in the order the analysis runs."""
    from workbench import build_model
    from workbench.dynamics.study import analyse_run
    from workbench.runtime.checkpoint import save_model

    run = save_model(build_model("fbt", "debug"), tmp_path / "run")
    told = []
    analyse_run(run, prompt="Q: Start with 3.", horizon=12, perturb_at=3, n_spectra=3, n_fixed=2, n_starts=2, max_passes=2, fp_steps=2, tangents=1,
                progress=lambda *a: told.append(a))  # fmt: skip
    phases = list(dict.fromkeys(p for p, _, _ in told))
    runs = [p for i, (p, _, _) in enumerate(told) if i == 0 or told[i - 1][0] != p]
    assert runs == phases  # each phase told in one stretch: a bar that closes is never reopened
    assert phases == [f"run: {p}" for p in ("rollout steps", "spectra", "fixed-point searches", "K-pass convergence")]
    for phase in phases:
        counts = [(d, t) for p, d, t in told if p == phase]
        assert [d for d, _ in counts] == sorted(d for d, _ in counts) and counts[-1][0] == counts[-1][1]
    assert [d for p, d, _ in told if p == "run: rollout steps"] == list(range(1, 13))


def test_a_zoo_without_out_trains_into_runs_preset_not_the_runs_root(monkeypatch, tmp_path):
    """Without ``--out`` a zoo trains into runs/PRESET, beside other zoos, never into runs/ itself."""
    import workbench.training.zoo as zoo

    monkeypatch.chdir(tmp_path)
    told = []
    monkeypatch.setattr(zoo, "train_zoo", lambda preset, out, **kw: told.append(out) or {"models": {}})
    main(["zoo", "--preset", "org-addition", "--no-progress"])
    assert told == [Path("runs") / "org-addition"]
