"""Fixtures shared by the whole suite (helpers that are not fixtures live in ``helpers.py``).

The suite runs one intra-op thread in this process and in every subprocess it starts: on a shared
2-core machine, two OpenMP threads per process under load spin against each other and make
debug-sized tests tens of times slower."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported; subprocesses inherit it

import pickle
from pathlib import Path

import pytest
import torch
from helpers import FAULT_ARCHS

from workbench import build_model, save_model

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


ANY_MODEL = {  # id: (arch, overrides); hd-shared is the shared key/value cache ablation
    "baseline": ("baseline", {}),
    "fbt": ("fbt", {}),
    "hd": ("hd", {"n_streams": 3}),
    "hd-shared": ("hd", {"n_streams": 3, "kv": "shared"}),
    # KV-Mirror: layer 1 the source, layers 2 (intra-stream) and 3 (cross-stream) the last stream only
    "hd-mirror": ("hd", {"n_streams": 3, "n_layers": 4, "cross_layers": (0, 3), "kv_mirror": 2}),
}


@pytest.fixture(params=list(ANY_MODEL))
def any_model(request):
    arch, overrides = ANY_MODEL[request.param]
    return build_model(arch, "debug", **overrides)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A saved ``debug`` checkpoint per architecture, for tests that damage a copy."""
    base = tmp_path_factory.mktemp("pristine")
    return {arch: save_model(build_model(arch, "debug", **kw), base / arch) for arch, kw in FAULT_ARCHS.items()}


@pytest.fixture(scope="session")
def micro_zoo(tmp_path_factory):
    """The ``micro`` zoo trained once per test session through the CLI (~15 s); tests that write
    into a run copy it first."""
    from workbench.cli import main

    out = tmp_path_factory.mktemp("zoo") / "micro"
    main(["zoo", "--preset", "micro", "--out", str(out), "--no-progress"])
    return out


@pytest.fixture(scope="session")
def micro_runs(tmp_path_factory):
    """The ``micro`` zoo's baseline and FBT configs (its task and settings) trained 2 steps, for
    tests that need runs of that task but not what the zoo's training (~15 s) teaches them."""
    from workbench.training.train import train
    from workbench.training.zoo import member_config, members

    out = tmp_path_factory.mktemp("micro-runs")
    for name, arch, overrides, _ in members("micro", out)[:2]:
        train(member_config("micro", arch, [*overrides, "train.steps=2"], None), out / name, progress=False)
    return out


@pytest.fixture(scope="session")
def two_tasks(tmp_path_factory):
    """``TASK/ARCH``: an FBT and an HD run of the flip-flop and of addition, trained 2 steps (a few
    seconds): runs of two tasks, for tests of what an instrument feeds a run by default."""
    from workbench.training.runconfig import make_run_config
    from workbench.training.train import train

    root = tmp_path_factory.mktemp("two-tasks")
    short = ["train.steps=2", "train.batch_size=2", "train.seq_len=32", "train.eval_examples=0", "data.n_train=50"]
    for task, settings in {"flipflop": ["data.flipflop_bits=1"], "addition": []}.items():
        for arch in ("fbt", "hd"):
            config = make_run_config(arch, "debug", task, [*short, *settings, "data.loss_on=completion"])
            train(config, root / task / arch, progress=False)
    return root


@pytest.fixture(scope="session")
def micro_study(tmp_path_factory):
    """The data-efficiency study on the micro zoo at two seeds, once per test session (~2 min)."""
    from workbench.cli import main

    out = tmp_path_factory.mktemp("study") / "data-efficiency"
    main(["zoo", "--study", "data-efficiency", "--seeds", "2", "--out", str(out), "--no-progress"])
    return out


@pytest.fixture
def no_unpickling(monkeypatch):
    """Loading anything under this fixture fails if it tries to unpickle."""

    def forbidden(*args, **kwargs):
        raise AssertionError("loading a checkpoint tried to unpickle")

    class Unpickler(pickle.Unpickler):  # still a class: modules imported lazily subclass it
        load = forbidden

    for module, name in [(pickle, "load"), (pickle, "loads"), (torch, "load")]:
        monkeypatch.setattr(module, name, forbidden)
    monkeypatch.setattr(pickle, "Unpickler", Unpickler)


def pytest_terminal_summary(terminalreporter):
    """The fault suites' tally (``tests/helpers.py``), one line per fault class they exercised."""
    import sys

    helpers = sys.modules.get("helpers")
    if helpers is None or not helpers.TALLY:
        return
    terminalreporter.section("fault tally")
    for name, c in helpers.TALLY.items():
        terminalreporter.write_line(
            f"{name}: inputs tried {c['inputs_tried']}, faults injected {c['faults_injected']}, data lost {c['data_lost']}"
        )


INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items):
    """Everything under ``tests/integration/`` is an integration test, and slow."""
    for item in items:
        if INTEGRATION in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.slow)
