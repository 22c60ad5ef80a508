"""User errors are the workbench's own type (``WorkbenchError``) and the CLI's one-line usage errors;
a bug keeps its traceback; ``WORKBENCH_DEBUG=1`` shows the traceback of a user error too. Also: the
one config validator and the one override parser, and the typed results of ``train`` and
``analyse_run``."""

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import tally

import models
import workbench
from models import FBTConfig, NonFiniteActivation
from workbench import BadInput, MissingFile, OutputBusy, OutputExists, WorkbenchError, build_model, generate, parse_override
from workbench.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(argv, env=None, patch=""):
    """``workbench ARGV`` in a fresh interpreter (exit status and tracebacks as a user sees them);
    ``patch``: Python run before ``main`` (e.g. a monkeypatched worker)."""
    script = textwrap.dedent(f"""
        import sys
        {patch}
        from workbench.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    env = {
        **{k: v for k, v in os.environ.items() if k != "WORKBENCH_DEBUG"},
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env, timeout=300)


# (verb's argv, the worker it calls at run time: module and name)
WORKERS = [
    (["generate", "fbt:debug", "--prompt", "a", "--max-new-tokens", "1"], "workbench.runtime.decoding", "generate"),
    (["presets"], "workbench.runtime.config", "build_model"),
    (["eval", "RUN"], "workbench.training.evaluate", "evaluate_run"),
    (["train", "--out", "OUT", "--no-progress"], "workbench.training.train", "train"),
]


@pytest.mark.parametrize(
    "bug",
    [
        KeyError("steps"),
        TypeError("unsupported operand"),
        RuntimeError("shape mismatch"),
        ValueError("a plain ValueError from deep inside"),
    ],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("argv,module,name", WORKERS, ids=[w[0][0] for w in WORKERS])
def test_a_bug_in_a_verb_propagates_instead_of_becoming_a_usage_line(tmp_path, monkeypatch, capsys, argv, module, name, bug):
    import importlib

    def broken(*args, **kwargs):
        raise bug

    monkeypatch.setattr(importlib.import_module(module), name, broken)
    monkeypatch.delenv("WORKBENCH_DEBUG", raising=False)
    argv = [str(tmp_path / a) if a in ("RUN", "OUT") else a for a in argv]
    if argv[0] == "eval":
        workbench.save_model(build_model("baseline", "debug"), argv[1])
    with pytest.raises(type(bug)) as info:
        main(argv)
    assert info.value is bug
    assert "error:" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_bug_exits_1_with_its_traceback():
    patch = "import workbench.runtime.config as c; c.build_model = lambda *a, **k: {}['missing key']"
    proc = run_cli(["presets"], patch=patch)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" in proc.stderr and "KeyError: 'missing key'" in proc.stderr
    assert "workbench presets: error:" not in proc.stderr


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "gpt:debug", "--prompt", "x"], "unknown architecture 'gpt'"),
        (["generate", "fbt:debug", "--prompt", "x" * 200], "is longer than the context n_ctx=128"),  # the model's own check
        (["generate", "baseline:debug", "--prompt", "x", "--regimes", "soft"], "regime 'soft' needs a Full-Bandwidth model"),
        (["train", "--out", "OUT", "--set", "model.d_model=30"], "config field d_model=30 is not divisible by n_heads=4"),
        (
            ["train", "--out", "OUT", "--set", "train.steps=ten"],
            "malformed override 'train.steps=ten': field train.steps expects int",
        ),
        (["eval", "OUT"], "OUT: no such run directory"),
        (
            ["cache", "fbt:debug", "--task", "modsum", "--hooks", "blocks.9.hook_q", "--out", "OUT"],
            "unknown hook name 'blocks.9.hook_q' for arch 'fbt'",
        ),
        (["cache", "fbt:debug", "--task", "modsum", "--hooks", "blocks.*.hook_nothing", "--out", "OUT"], "matches no hook point"),
    ],
)
def test_a_user_error_is_one_line_with_status_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.delenv("WORKBENCH_DEBUG", raising=False)
    argv = [str(tmp_path / a) if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "Traceback" not in err and "\n" not in err, err
    assert err.startswith(f"workbench {argv[0]}: error:") and message.replace("OUT", str(tmp_path / "OUT")) in err, err


@pytest.mark.parametrize("seed", ["-1", str(2**32), "x"])
def test_a_seed_no_generator_takes_is_refused_by_the_parser(capsys, seed):
    with pytest.raises(SystemExit) as info:  # numpy refuses negative seeds, scikit-learn those >= 2**32
        main(["probe", "RUN", "--target", "memory", "--seed", seed])
    assert info.value.code == 2 and "argument --seed: invalid seed" in capsys.readouterr().err


@pytest.mark.slow
def test_an_error_of_the_environment_is_one_line_with_status_2(tmp_path, monkeypatch, capsys):
    import workbench.storage.files as files

    def full_disk(path, data):
        raise OSError(errno.ENOSPC, f"cannot write {path}: No space left on device")

    monkeypatch.setattr(files, "write_json", full_disk)
    monkeypatch.delenv("WORKBENCH_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        main(["presets", "--json", str(tmp_path / "presets.json")])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("workbench presets: error:") and "No space left on device" in err, err


def test_workbench_debug_shows_the_traceback_of_a_user_error(monkeypatch, capsys):
    monkeypatch.setenv("WORKBENCH_DEBUG", "1")
    with pytest.raises(BadInput, match="unknown architecture 'gpt'"):
        main(["generate", "gpt:debug", "--prompt", "x"])
    monkeypatch.setenv("WORKBENCH_DEBUG", "0")  # 0 is off
    with pytest.raises(SystemExit) as info:
        main(["generate", "gpt:debug", "--prompt", "x"])
    assert info.value.code == 2


@pytest.mark.slow
def test_workbench_debug_from_a_shell():
    argv = ["generate", "gpt:debug", "--prompt", "x"]
    quiet, loud = run_cli(argv), run_cli(argv, env={"WORKBENCH_DEBUG": "1"})
    assert quiet.returncode == 2 and quiet.stderr.strip() == (
        "workbench generate: error: unknown architecture 'gpt': expected one of ['baseline', 'fbt', 'hd']"
    ), quiet.stderr
    assert loud.returncode == 1 and "Traceback" in loud.stderr
    assert "workbench.storage.errors.BadInput: unknown architecture 'gpt'" in loud.stderr, loud.stderr


# ---- the error types, for library users -------------------------------------------------


def test_each_user_error_is_a_workbench_error_and_the_builtin_it_used_to_be():
    from workbench.dynamics.feedback import RolloutDiverged
    from workbench.runtime.decoding import NonFinite
    from workbench.training.train import TrainingDiverged

    assert issubclass(BadInput, ValueError) and issubclass(MissingFile, FileNotFoundError)
    assert issubclass(OutputExists, FileExistsError) and issubclass(workbench.NotADirectory, NotADirectoryError)
    for kind in (OutputBusy, TrainingDiverged, RolloutDiverged, NonFinite):
        assert issubclass(kind, RuntimeError)
    assert issubclass(NonFinite, NonFiniteActivation)
    for kind in (
        BadInput,
        MissingFile,
        OutputExists,
        workbench.NotADirectory,
        OutputBusy,
        TrainingDiverged,
        RolloutDiverged,
        NonFinite,
    ):
        assert issubclass(kind, WorkbenchError)
    from workbench.storage.outputs import OutputBusy as from_outputs

    assert from_outputs is OutputBusy


def test_library_calls_raise_the_workbench_types(tmp_path):
    with pytest.raises(BadInput, match="unknown preset 'huge'"):
        build_model("fbt", "huge")
    with pytest.raises(MissingFile, match="no run directory"):
        workbench.load_model(tmp_path / "nowhere")
    run = workbench.save_model(build_model("fbt", "debug"), tmp_path / "run")
    (run / "config.json").write_text("{")
    with pytest.raises(BadInput, match="corrupt JSON in .*config.json"):
        workbench.load_model(run)
    with pytest.raises(OutputExists, match="already holds a model"):
        workbench.save_model(build_model("fbt", "debug"), run)
    with pytest.raises(BadInput, match="token id 500 is outside the vocabulary"):
        generate(build_model("fbt", "debug"), [[5, 500]])


def test_an_overflow_in_generate_is_a_non_finite_user_error():
    model = build_model("fbt", "debug")
    with torch.no_grad():
        model.get_parameter("blocks.0.mlp.W_out.weight").view(-1)[0] = 1e30
    with pytest.raises(WorkbenchError, match="non-finite activation: blocks.1.ln1 input overflowed at step 0") as info:
        generate(model, [[5, 6, 7]], max_new_tokens=2)
    assert isinstance(info.value, NonFiniteActivation) and info.value.step == 0


# ---- one validator, one parser -----------------------------------------------------------


def test_one_validator_for_python_values_json_values_and_every_section():
    from workbench.runtime.config import config_from_dict
    from workbench.training.runconfig import TrainConfig, run_config_from_dict

    # the model configs validate themselves (models cannot import the workbench) ...
    with pytest.raises(models.FieldTypeError, match=r"^config field d_model=32.5: expected int$") as info:
        FBTConfig(d_model=32.5)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)  # what both old validators raised
    with pytest.raises(models.ConfigError, match=r"cross_layers=1: expected tuple\[int, \.\.\.\] \| None"):
        models.HDConfig(cross_layers=1)
    # ... and the workbench's configs, Python or JSON, go through the same function: the same message
    for call in (lambda: build_model("fbt", "debug", d_model=32.5), lambda: config_from_dict("fbt", {"d_model": 32.5})):
        with pytest.raises(BadInput, match=r"^config field d_model=32.5: expected int$"):
            call()
    with pytest.raises(BadInput, match=r"^config field steps='ten': expected int$"):
        TrainConfig(steps="ten")
    with pytest.raises(BadInput, match=r"config field train.lr=nan: expected float"):
        run_config_from_dict({"arch": "fbt", "model": {}, "train": {"lr": float("nan")}, "data": {}, "fbt": {}, "hd": {}})
    with pytest.raises(BadInput, match=r"unknown config field 'd_modle' for arch 'fbt': expected one of \["):
        config_from_dict("fbt", {"d_modle": 3})


def test_one_override_parser_for_model_fields_and_run_sections():
    from workbench.training.runconfig import SECTIONS, make_run_config

    assert parse_override("hd", "cross_layers=0,1") == ("cross_layers", (0, 1))
    assert parse_override("fbt", "train.lr=3e-4", SECTIONS) == ("train.lr", 3e-4)
    assert parse_override("hd", "model.cross_window=none", SECTIONS) == ("model.cross_window", None)
    assert parse_override("hd", "hd.streams=2,4", SECTIONS) == ("hd.streams", (2, 4))
    cases = [
        ("train.lr", "malformed override 'train.lr': expected SECTION.FIELD=VALUE"),
        (
            "nosection.x=1",
            "malformed override 'nosection.x=1': expected SECTION.FIELD=VALUE with SECTION in ['model', 'train', 'data', 'fbt', 'hd']",
        ),
        ("train.nofield=1", "unknown config field 'train.nofield' in override 'train.nofield=1': expected one of ["),
        ("train.steps=ten", "malformed override 'train.steps=ten': field train.steps expects int"),
        (
            "model.cross_layers=a",
            r"malformed override 'model.cross_layers=a': field model.cross_layers expects tuple[int, ...] | None",
        ),
    ]
    for text, message in cases:  # the parser itself, and the run config built from --set
        for call in (lambda t=text: parse_override("hd", t, SECTIONS), lambda t=text: make_run_config("hd", "debug", None, [t])):
            with pytest.raises(BadInput) as info:
                call()
            assert str(info.value).startswith(message), str(info.value)
    with pytest.raises(BadInput, match="malformed override 'd_model': expected FIELD=VALUE"):
        parse_override("fbt", "d_model")


# ---- results as types --------------------------------------------------------------------


def test_train_returns_the_model_beside_a_json_summary(tmp_path):
    from workbench.training.runconfig import make_run_config
    from workbench.training.train import TrainResult, train

    cfg = make_run_config(
        "fbt", "debug", "modsum", ["train.steps=2", "train.batch_size=2", "train.seq_len=16", "train.warmup=1", "data.n_train=50"]
    )
    result = train(cfg, tmp_path / "run", progress=False)
    assert isinstance(result, TrainResult) and isinstance(result.model, models.FullBandwidthLM)
    assert json.loads(json.dumps(result.summary)) == result.summary
    assert result.summary["steps"] == 2 and result.summary["resumed_from"] is None


def test_analyse_run_returns_the_report_beside_the_states(tmp_path):
    from workbench.dynamics.study import DynamicsResult, analyse_run

    run = workbench.save_model(build_model("fbt", "debug"), tmp_path / "fbt")
    result = analyse_run(run, prompt="Q: Start with 3.", horizon=12, perturb_at=3, n_spectra=1, n_fixed=0, max_passes=2)
    assert isinstance(result, DynamicsResult) and "_states" not in result.report
    assert json.loads(json.dumps(result.report)) == result.report
    assert result.states.shape == (result.report["horizon"], 32) and result.states.dtype == torch.float32


# ---- settings no machine can hold or torch cannot take ---------------------------------


SETTINGS = tally("out-of-range settings")
HOSTILE = tally("hostile model files")
HUGE = str(10**18)
TRAIN = ["--no-progress", "--set", "train.steps=2", "--set", "train.batch_size=4", "--set", "train.seq_len=32"]

# (argv, what the one line names); OUT is the output path, which must not appear
OUT_OF_RANGE = [
    (["train", "--set", "model.n_layers=1000000000"], ["model.n_layers=1000000000", "more than the"]),
    (["train", "--set", "train.device=abc"], ["train field device='abc'", "expected auto, cpu, cuda or cuda:N"]),
    (["train", "--set", "train.device=cuda:99"], ["train field device='cuda:99'", "CUDA device"]),
    (["train", "--set", f"train.seed={HUGE}"], [f"train field seed={HUGE}", "expected 0..4294967295"]),
    (["train", "--set", f"train.batch_size={HUGE}"], [f"train.batch_size={HUGE}", "a training step's", "more than the"]),
    (["train", "--set", f"model.d_vocab={HUGE}"], [f"model.d_vocab={HUGE}", "more than the"]),
    (["train", "--set", f"model.d_model={HUGE}"], [f"model.d_model={HUGE}", "more than the"]),
    (["train", "--set", f"model.d_mlp={HUGE}"], [f"model.d_mlp={HUGE}", "more than the"]),
    (["train", "--arch", "hd", "--set", f"hd.streams={HUGE}"], [f"hd.streams={HUGE}", "more than the"]),
    (["train", "--arch", "hd", "--set", "hd.streams=[1000000]"], ["hd.streams=1000000", "more than the"]),
    (
        ["train", "--arch", "hd", "--set", "hd.streams=2,1000000", "--set", "hd.expand_at=0,1"],
        ["hd.streams=1000000", "more than the"],
    ),
    (["train", "--set", f"model.d_model={10**30}"], [f"d_model={10**30}", "a size torch cannot allocate"]),
    (["train", "--arch", "hd", "--set", f"model.cross_window={10**20}"], [f"cross_window={10**20}", "2**63 - 1"]),
    (["train", "--set", "train.lr=1e308"], ["train field lr=1e+308", "expected a number in (0, 1]"]),
    (["train", "--set", "train.weight_decay=1e308"], ["weight_decay=1e+308", "lr x weight_decay <= 1"]),
    (["train", "--set", "train.beta1=1"], ["train field beta1=1.0", "[0, 1)"]),
    (["train", "--set", "train.beta2=1"], ["train field beta2=1.0", "[0, 1)"]),
    (["train", "--set", f"train.eval_examples={HUGE}"], [f"eval_examples={HUGE}", "expected 0..1,000,000"]),
    (["generate", "fbt:debug", "--prompt", "a", "--threads", HUGE], [f"--threads {HUGE}", "at most 1,024"]),
    (["eval", "RUN", "--threads", HUGE], [f"--threads {HUGE}"]),
    (["cache", "fbt:debug", "--hooks", "hook_embed", "--out", "OUT", "--threads", HUGE], [f"--threads {HUGE}"]),
    (["probe", "RUN", "--target", "memory", "--out", "OUT", "--threads", HUGE], [f"--threads {HUGE}"]),
    (["dynamics", "RUN", "--out", "OUT", "--threads", HUGE], [f"--threads {HUGE}"]),
    (["traces", "RUN", "--out", "OUT", "--threads", HUGE], [f"--threads {HUGE}"]),
    (["zoo", "--out", "OUT", "--jobs", str(10**20), "--no-progress"], [f"--jobs {10**20}", "at most 1,024"]),
    (["zoo", "--out", "OUT", "--threads", str(10**20), "--no-progress"], [f"--threads {10**20}", "at most 1,024"]),
    (["generate", "RUN", "--prompt", "\udcff"], ["--prompt '\\udcff': not UTF-8 text (b'\\xff' at character 0)"]),
    (["dynamics", "RUN", "--prompt", "ab\udcfe", "--out", "OUT"], ["--prompt 'ab\\udcfe': not UTF-8 text"]),
]


@pytest.mark.parametrize("argv,named", OUT_OF_RANGE, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else "")
def test_a_setting_out_of_range_is_one_line_before_anything_is_written(tmp_path, argv, named):
    """Sizes that would exhaust memory or hang, values torch cannot take, undecodable text: exit 2
    with one line naming the value, in seconds, and the output directory is never made."""
    import time

    from helpers import assert_usage_error, stamps

    run = workbench.save_model(build_model("fbt", "debug"), tmp_path / "run")
    before = stamps(run)
    argv = [str(tmp_path / "out") if a == "OUT" else str(run) if a == "RUN" else a for a in argv]
    if argv[0] == "train":  # the setting under test last: a later --set of the same field wins
        argv = ["train", "--out", str(tmp_path / "out"), *TRAIN, *argv[1:]]
    SETTINGS["inputs_tried"] += 1
    threads = torch.get_num_threads()
    started = time.perf_counter()
    message = assert_usage_error(argv, *named)
    assert time.perf_counter() - started < 60, message
    assert not (tmp_path / "out").exists(), sorted(p.name for p in (tmp_path / "out").iterdir())
    assert stamps(run) == before and torch.get_num_threads() == threads


def test_a_run_whose_config_no_machine_holds_is_refused_by_every_verb_that_loads_it(tmp_path):
    """A run's config.json saying n_layers 10^9 is named (file and field) by eval and generate in
    seconds; eval's results/ is not made."""
    from helpers import assert_usage_error, stamps

    run = workbench.save_model(build_model("fbt", "debug"), tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["model"]["n_layers"] = 10**9
    (run / "config.json").write_text(json.dumps(config))
    before = stamps(run)
    for argv in (["eval", str(run), "--n", "2"], ["generate", str(run), "--prompt", "a"]):
        HOSTILE["faults_injected"] += 1
        assert_usage_error(argv, f"bad model config in {run / 'config.json'}: n_layers=1000000000", "more than the")
    assert stamps(run) == before


@pytest.mark.slow
def test_a_resumed_run_whose_saved_batch_no_machine_holds_is_refused(tmp_path):
    from helpers import assert_usage_error, cli, stamps

    out = str(tmp_path / "run")
    code, _, err = cli(["train", "--out", out, *TRAIN, "--set", "train.steps=4", "--stop-after", "2"])
    assert code is None, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config["train"]["batch_size"] = 10**18
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    before = stamps(tmp_path / "run")
    SETTINGS["faults_injected"] += 1
    assert_usage_error(["train", "--resume", "--out", out, "--no-progress"], f"train.batch_size={10**18}", "more than the")
    assert stamps(tmp_path / "run") == before


@pytest.mark.slow
def test_an_undecodable_prompt_byte_from_a_shell_is_one_line():
    """``generate --prompt $'\\xff'``: argv bytes that are not UTF-8 reach Python as a lone
    surrogate; the one line names them."""
    script = "import sys; from workbench.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("WORKBENCH_DEBUG", None)
    argv = [sys.executable.encode(), b"-c", script.encode(), b"generate", b"fbt:debug", b"--prompt", b"x\xff"]
    proc = subprocess.run(argv, capture_output=True, env=env, timeout=300)
    err = proc.stderr.decode()
    SETTINGS["inputs_tried"] += 1
    assert proc.returncode == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "--prompt 'x\\udcff': not UTF-8 text (b'\\xff' at character 1)" in err, err
