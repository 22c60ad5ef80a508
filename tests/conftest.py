import pickle

import pytest
import torch

from workbench import build_model

VOCAB = 100  # ids the character tokenizer uses; every preset has d_vocab 128


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tokens(batch=2, length=12, seed=0):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=["baseline", "fbt", "hd"])
def any_model(request):
    overrides = {"n_streams": 3} if request.param == "hd" else {}
    return build_model(request.param, "debug", **overrides)


def sequential_fbt_states(model, toks, fuse_start=0):
    """The FBT ground truth computed without a cache: at each step re-run the whole prefix on the
    explicit fused inputs u_0..u_t. u_t = e_t for t < max(fuse_start, 1)."""
    embed = model.embed(toks)
    inputs, states = [], []
    B, L = toks.shape
    for t in range(L):
        e = embed[:, t : t + 1]
        if t < max(fuse_start, 1):
            u = e
        else:
            u = model.fusion(states[-1][:, None], e, torch.ones(B, 1, dtype=torch.bool))
        inputs.append(u)
        prefix = toks[:, : t + 1]
        h = model.run_stack(torch.cat(inputs, dim=1), model.context(prefix, None, None))
        states.append(h[:, -1])
    return torch.stack(states, dim=1)


@pytest.fixture(scope="session")
def micro_zoo(tmp_path_factory):
    """The ``micro`` zoo trained once per test session through the CLI (~15 s); tests that write
    into a run copy it first."""
    from workbench.cli import main

    out = tmp_path_factory.mktemp("zoo") / "micro"
    main(["zoo", "--preset", "micro", "--out", str(out), "--no-progress"])
    return out


@pytest.fixture(scope="module")
def one_torch_thread():
    """debug-sized models on a shared 2-core machine: one intra-op thread is many times faster
    than two (``pytestmark = pytest.mark.usefixtures("one_torch_thread")`` in a module)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    """The fault suites' tally (``tests/faultkit.py``), one line per fault class they exercised."""
    import sys

    faultkit = sys.modules.get("faultkit")
    if faultkit is None or not faultkit.TALLY:
        return
    terminalreporter.section("fault tally")
    for name, c in faultkit.TALLY.items():
        terminalreporter.write_line(f"{name}: inputs tried {c['inputs_tried']}, faults injected {c['faults_injected']}, "
                                    f"data lost {c['data_lost']}")
