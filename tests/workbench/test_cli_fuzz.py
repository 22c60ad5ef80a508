"""The command line, fuzzed: every invalid command line is a one-line usage error, never a
traceback, and nothing it points at changes.

``COUNTS`` tallies the inputs tried, the faults injected and the data lost (which must stay zero);
pytest prints every fault class's tally at the end of the session (``tests/helpers.py``)."""

import importlib
import shutil
from pathlib import Path

import pytest
from helpers import (
    FAST,
    RUN_FAULTS,
    C,
    W,
    assert_usage_error,
    cli,
    nan_weight,
    other_arch,
    remove,
    stamps,
    tally,
    truncate,
    write,
)
from helpers import assert_nothing_lost as _assert_nothing_lost
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import load_model

COUNTS = tally(RUN_FAULTS)


pytestmark = pytest.mark.slow


def assert_nothing_lost(before: dict, after: dict) -> None:
    _assert_nothing_lost(before, after, COUNTS)


# ---- 4. the command line, fuzzed ----------------------------------------------------------


class ReachedRealWork(BaseException):
    """A fuzzed command line passed validation: the strategies built a valid command."""


def real_work(*args, **kwargs):
    raise ReachedRealWork(args, kwargs)


# where each verb's real work starts; generate is left alone (a debug model's generation is cheap,
# and its argument checks live inside it)
HEAVY = [
    ("workbench.training.train", "load_task"),
    ("workbench.training.zoo", "train_zoo"),
    ("workbench.demo", "cache_parity"),
    ("subprocess", "call"),
    ("workbench.runtime.export", "export_hf"),
    ("workbench.training.evaluate", "evaluate_examples"),
    ("workbench.probing.store", "cache_activations"),
    ("workbench.probing.study", "cache_activations"),
    ("workbench.dynamics.study", "rollout"),
    ("workbench.studies.traces", "run_traces"),
    ("workbench.bench.suite", "build_model"),
    ("workbench.bench.decode", "build_model"),
    ("workbench.bench.train_steps", "build_model"),
    ("workbench.bench.suite", "_store_rss"),
]

NAMES = st.text(max_size=12).filter(lambda s: ":" not in s)  # unicode junk, never ARCH:PRESET
INTS = st.integers(-(10**6), 10**6).map(str)
NUMBERS = st.one_of(
    INTS,
    INTS,
    st.integers(-(10**30), 10**30).map(str),
    st.floats().map(repr),
    st.sampled_from(["nan", "inf", "1e309", "0x10", "", " ", "1_0", "٣", "--5", "2**8", "exact"]),
)
PATHS = st.one_of(NAMES, st.sampled_from(["out", "a/b/c", "afile", "afile/below", ".", "/proc/denied/x"]))
TASKS = st.one_of(NAMES, st.sampled_from(["chain", "mix", "modsum", "sudoku", "jsonl:nowhere.jsonl", "text:", "hf:"]))
REGIMES = st.one_of(NAMES, st.sampled_from(["standard", "soft,fused", "standard,soft,fused", ",,", "greedy"]))
HOOKS = st.one_of(NAMES, st.sampled_from(["blocks.*.hook_resid_post", "hook_embed", "blocks.9.hook_q", "*"]))
UNKNOWN_FLAGS = st.sampled_from(["--bogus", "--zz-top", "-Q", "--Out", "---x"])  # no prefix of a real flag
BAD_OVERRIDES = st.one_of(
    NAMES.filter(lambda s: "=" not in s),
    st.sampled_from(
        [
            "train.lr=-1",
            "train.lr=nan",
            "train.lr=inf",
            "train.steps=0",
            "train.steps=ten",
            "model.d_model=30",
            "model.n_layers=0",
            "hd.streams=4,2",
            "fbt.three_pass_fraction=1.5",
            "data.task=sudoku",
            "nosection.x=1",
            "train.nofield=1",
            "train.lr",
            "=",
            "",
            "train.seq_len=4096",
            "model.d_model=abc",
            "data.modsum_p=1",
            "train.grad_accum=3",
            "hd.supervise=none",
            "train.beta1=2",
            "model.norm_eps=nan",
            "model.n_heads=-4",
            # settings that exhausted memory, hung or reached torch before sizes were bounded
            "model.n_layers=1000000000",
            "model.d_vocab=1000000000000000000",
            "model.d_model=1000000000000000000000000000000",
            "model.cross_window=100000000000000000000",
            "hd.streams=1000000000000000000",
            "train.batch_size=1000000000000000000",
            "train.seed=1000000000000000000",
            "train.device=abc",
            "train.lr=1e308",
            "train.beta2=1",
        ]
    ),
)

# (flag,) for a switch, (flag, values) for an option; REQUIRED ones are in every example
OPTIONS = {
    "demo": [("--out", PATHS), ("--preset", NAMES), ("--seed", NUMBERS)],
    "generate": [
        ("--prompt", NAMES),
        ("--regimes", REGIMES),
        ("--passes", NUMBERS),
        ("--max-new-tokens", NUMBERS),
        ("--temperature", NUMBERS),
        ("--top-k", NUMBERS),
        ("--seed", NUMBERS),
        ("--json", PATHS),
        ("--chat",),
    ],
    "export": [("--json", PATHS)],
    "import": [("--json", PATHS)],
    "train": [
        ("--arch", st.sampled_from(["baseline", "fbt", "hd", "gpt", ""])),
        ("--preset", NAMES),
        ("--task", TASKS),
        ("--out", PATHS),
        ("--set", BAD_OVERRIDES),
        ("--init-from", PATHS),
        ("--stop-after", NUMBERS),
        ("--json", PATHS),
        ("--resume",),
        ("--no-progress",),
    ],
    "eval": [("--n", NUMBERS), ("--passes", NUMBERS), ("--task", TASKS), ("--json", PATHS)],
    "zoo": [
        ("--preset", st.sampled_from(["micro", "quick", "cpu"])),
        ("--out", PATHS),
        ("--only", NAMES),
        ("--json", PATHS),
        ("--no-progress",),
    ],
    "cache": [
        ("--hooks", HOOKS),
        ("--task", TASKS),
        ("--n", NUMBERS),
        ("--prefill", st.sampled_from(["standard", "recurrent", "x"])),
        ("--passes", NUMBERS),
        ("--seed", NUMBERS),
        ("--out", PATHS),
        ("--json", PATHS),
    ],
    "probe": [
        ("--target", st.sampled_from(["memory", "running_sum", "value", "x"])),
        ("--hooks", HOOKS),
        ("--passes", st.one_of(NUMBERS, st.sampled_from(["2,3", "0,1", "a,b", ","]))),
        ("--n", NUMBERS),
        ("--seed", NUMBERS),
        ("--out", PATHS),
        ("--json", PATHS),
        ("--no-exact",),
    ],
    "dynamics": [
        (flag, NUMBERS)
        for flag in ("--horizon", "--perturb-at", "--spectra", "--fixed-points", "--starts", "--max-passes", "--fp-steps")
    ]
    + [("--out", PATHS), ("--json", PATHS)],
    "traces": [
        ("--task", st.one_of(NAMES, st.sampled_from(["chain", "gsm8k-jsonl:nowhere.jsonl"]))),
        ("--regimes", REGIMES),
        ("--passes", NUMBERS),
        ("--n", NUMBERS),
        ("--difficulty", st.one_of(NAMES, st.sampled_from(["1..4", "0..2", "4..1"]))),
        ("--max-new-tokens", NUMBERS),
        ("--seed", NUMBERS),
        ("--out", PATHS),
        ("--json", PATHS),
        ("--chat",),
    ],
    "presets": [("--json", PATHS)],
    "app": [("--runs", PATHS), ("--port", NUMBERS), ("--address", NAMES)],
    "bench": [("--preset", NAMES), ("--reps", NUMBERS), ("--only", NAMES), ("--store-positions", NUMBERS), ("--json", PATHS)],
}
REQUIRED = {
    "generate": ["--prompt"],
    "train": ["--out"],
    "cache": ["--hooks", "--out"],
    "probe": ["--target"],
    "dynamics": ["--out"],
    "traces": ["--out"],
}


def is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def tokens_of(option) -> st.SearchStrategy:
    flag, *values = option
    return st.tuples(st.just(flag), values[0]).map(list) if values else st.just([flag])


def argv_strategy(verb: str, bad_runs: list[str], bad_models: list[str], resume_bad: list[str], a_file: str):
    """[VERB, positionals, required options, random options, tail]. Every example carries a poison
    that makes it fail before real work whatever the random part holds: a positional run or model
    that cannot load, or a tail that is an argparse error or an invalid value (the tail comes last,
    so for a single-valued option it is the value that counts)."""
    run, model = st.sampled_from(bad_runs), st.sampled_from(bad_models)
    argparse_error = st.one_of(UNKNOWN_FLAGS.map(lambda f: [f]), st.tuples(UNKNOWN_FLAGS, NAMES).map(list))
    options = {o[0]: o for o in OPTIONS[verb]}
    required = st.tuples(*[tokens_of(options[f]) for f in REQUIRED.get(verb, [])]).map(lambda parts: sum(parts, []))
    random = st.lists(st.one_of(*map(tokens_of, OPTIONS[verb])), max_size=6).map(lambda parts: sum(parts, []))
    # generate: a loadable debug model is allowed when the tail is an argument generate() rejects
    generate = st.one_of(
        st.tuples(model.map(lambda m: [m]), st.just([])),
        st.tuples(
            st.sampled_from(["baseline:debug", "fbt:debug", "hd:debug:3"]).map(lambda m: [m]),
            st.one_of(
                st.sampled_from(["0", "-3", "129", "100000"]).map(lambda n: ["--max-new-tokens", n]),
                st.sampled_from(["greedy", ",", "standard,beam"]).map(lambda r: ["--regimes", r]),
                st.sampled_from(["-1", "-0.5", "-inf"]).map(lambda t: ["--temperature", t]),
                st.sampled_from(["0", "-2"]).map(lambda k: ["--top-k", k]),
                argparse_error,
            ),
        ),
    )
    head_tail = {
        "generate": generate,
        "export": st.tuples(st.tuples(model, PATHS).map(list), st.just([])),
        # import: a source that is no model (every example fails before anything is read)
        "import": st.tuples(
            st.tuples(st.one_of(NAMES.filter(lambda s: s != "smollm2"), st.sampled_from(bad_runs)), PATHS).map(list), st.just([])
        ),
        "cache": st.tuples(model.map(lambda m: [m]), st.just([])),
        "eval": st.tuples(run.map(lambda r: [r]), st.just([])),
        "probe": st.tuples(run.map(lambda r: [r]), st.just([])),
        "dynamics": st.tuples(st.lists(run, min_size=1, max_size=3), st.just([])),
        "traces": st.tuples(st.lists(run, min_size=1, max_size=3), st.just([])),
        "demo": st.tuples(
            st.just([]),
            st.one_of(
                argparse_error,
                NAMES.filter(lambda s: not is_int(s)).map(lambda s: ["--seed", s]),
                st.one_of(NAMES, st.sampled_from(["huge", "DEBUG", "debug "]))
                .filter(lambda s: s not in ("debug", "tiny", "small", "gpu"))
                .map(lambda p: ["--preset", p]),
            ),
        ),
        "train": st.tuples(
            st.just([]),
            st.one_of(
                argparse_error,
                BAD_OVERRIDES.map(lambda o: ["--set", o]),
                st.sampled_from(["sudoku", "jsonl", "", "chain "]).map(lambda t: ["--task", t]),
                st.sampled_from(resume_bad).map(lambda r: ["--resume", "--out", r]),
            ),
        ),
        "zoo": st.tuples(
            st.just([]),
            st.one_of(
                argparse_error,
                st.sampled_from(["huge", "", "MICRO"]).map(lambda p: ["--preset", p]),
                st.sampled_from([["--out"], ["--only"]]),
                st.tuples(st.sampled_from(["--jobs", "--threads"]), st.sampled_from(["0", "-3", "1025", str(10**20)])).map(list),
            ),
        ),
        "presets": st.tuples(st.just([]), st.one_of(argparse_error, NAMES.map(lambda s: [s]), st.just(["--json"]))),
        "app": st.tuples(
            st.just([]),
            st.one_of(
                argparse_error,
                st.sampled_from(["0", "65536", "-1", "http", "", "80.5", "1e3"]).map(lambda p: ["--port", p]),
                st.just(["--runs", a_file]),
            ),
        ),
        # bench checks --reps and every --only key before measuring anything
        "bench": st.tuples(
            st.just([]),
            st.one_of(
                argparse_error,
                st.sampled_from(["4", "0", "-5", "five", "", "5.0"]).map(lambda r: ["--reps", r]),
                NAMES.map(lambda k: ["--only", k + "?"]),
                st.sampled_from(["huge", "", "SMALL"]).map(lambda p: ["--preset", p]),
            ),
        ),
    }[verb]
    return st.tuples(head_tail, required, random).map(lambda t: [verb, *t[0][0], *t[1], *t[2], *t[0][1]])


@pytest.fixture(scope="module")
def fuzz_targets(tmp_path_factory, pristine):
    """Runs that fail to load (for verbs that load one), specs that fail to resolve, and run
    directories that fail to resume."""
    base = tmp_path_factory.mktemp("fuzz_targets")
    (base / "afile").write_text("not a run")
    (base / "empty").mkdir()
    for name, fault in [
        ("truncated", lambda r: truncate(0.5)(r / W)),
        ("no-weights", lambda r: remove(r / W)),
        ("garbage-config", lambda r: write("x")(r / C)),
        ("wrong-arch", lambda r: other_arch(r / C)),
        ("nan-weights", lambda r: nan_weight(r / W)),
    ]:
        fault(shutil.copytree(pristine["fbt"], base / name))
    bad_runs = [
        str(base / n) for n in ("afile", "empty", "truncated", "no-weights", "garbage-config", "wrong-arch", "nan-weights")
    ]
    bad_runs += [str(base / "nowhere"), "no/such/run", "rün😀", "gpt:debug", "\x00"]
    for r in bad_runs:
        with pytest.raises((ValueError, OSError)):
            load_model(r)
    bad_models = bad_runs + ["fbt:huge", "fbt:debug:x", "fbt:debug:99999999999999999999999", "::", "hd:debug:1:2", "baseline:"]
    resume_bad = [str(base / "nowhere"), str(base / "garbage-config"), str(pristine["fbt"])]  # the last: no training state
    return {"bad_runs": bad_runs, "bad_models": bad_models, "resume_bad": resume_bad, "a_file": str(base / "afile"), "base": base}


VERBS = [
    "demo",
    "generate",
    "export",
    "import",
    "train",
    "eval",
    "zoo",
    "cache",
    "probe",
    "dynamics",
    "traces",
    "presets",
    "app",
    "bench",
]
FUZZ_EXAMPLES = 200  # per verb


@pytest.mark.parametrize("verb", VERBS)
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzzed_command_lines_are_usage_errors_never_tracebacks(
    fuzz_targets, pristine, tmp_path, monkeypatch, no_unpickling, verb, data
):
    """Every example is an invalid command line (see ``argv_strategy``); the only acceptable
    outcomes are exit status 2 with a message, or 0 for --help. Nothing the examples point at changes."""
    if Path.cwd() != tmp_path:  # once per test: the examples share the directory and the patches
        # import every module before patching any: a module first imported under the patches would
        # bind a patched name (``from workbench.probing.store import cache_activations``) for good
        modules = [importlib.import_module(module) for module, _ in HEAVY]
        for module, (_, name) in zip(modules, HEAVY):
            monkeypatch.setattr(module, name, real_work)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "afile").write_text("a file where a directory is expected")
    before = stamps(fuzz_targets["base"]), stamps(pristine["fbt"].parent)
    t = fuzz_targets
    argv = data.draw(argv_strategy(verb, t["bad_runs"], t["bad_models"], t["resume_bad"], t["a_file"]), label="argv")
    COUNTS["inputs_tried"] += 1
    code, out, err = cli(argv)
    assert code is not None, f"{argv} ran to completion"
    if code == 0:
        assert "usage:" in out, (argv, out)  # --help, or an abbreviation of it
    else:
        assert code == 2 and "Traceback" not in err and "error" in err, (argv, code, err)
    assert_nothing_lost(before[0], stamps(t["base"]))
    assert_nothing_lost(before[1], stamps(pristine["fbt"].parent))


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb):
    code, out, _ = cli([verb, "--help"])
    assert code == 0 and "usage: workbench " + verb in out


@pytest.mark.parametrize(
    "argv,path",
    [
        (["generate", "fbt:debug", "--prompt", "a", "--max-new-tokens", "1", "--json", "afile/out.json"], "afile/out.json"),
        (["export", "baseline:debug", "afile/hf"], "afile/hf"),
        (["traces", "run", "--out", "afile/traces"], "afile/traces"),  # a run (its config), so the output is what fails
        (
            ["train", "--out", "afile/run", "--no-progress", *[a for s in FAST + ["train.steps=1"] for a in ("--set", s)]],
            "afile/run",
        ),
    ],
)
def test_an_unwritable_output_path_is_a_usage_error(tmp_path, monkeypatch, argv, path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file where a directory is expected")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"arch": "fbt"}')
    COUNTS["faults_injected"] += 1
    assert_usage_error(argv, "afile")
    assert (tmp_path / "afile").read_text() == "a file where a directory is expected"
