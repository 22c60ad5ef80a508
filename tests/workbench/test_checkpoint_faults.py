"""Corrupt, truncated or missing checkpoint files, configs and tokenizers: every fault is a
named error or an identical load, never a silent change.

``COUNTS`` tallies the inputs tried, the faults injected and the data lost (which must stay zero);
pytest prints every fault class's tally at the end of the session (``tests/helpers.py``)."""

import json
import pickle
import shutil

import pytest
import torch
from helpers import (
    FAULT_ARCHS,
    RUN_FAULTS,
    C,
    T,
    W,
    a_directory,
    assert_usage_error,
    edit_json,
    edit_model,
    flip,
    nan_weight,
    other_arch,
    remove,
    tally,
    tokens,
    truncate,
    write,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from workbench import CharTokenizer, build_model, load_model
from workbench.runtime.checkpoint import load_weights, save_weights

COUNTS = tally(RUN_FAULTS)


# ---- 1. corrupt, truncated or missing checkpoint files ------------------------------------


def other_size(p):
    arch = json.loads((p.parent / C).read_text())["arch"]
    save_weights(p, build_model(arch, "debug", d_model=64, **ARCH_OVERRIDES[arch]).state_dict())


def more_ids(p):
    def grow(c):
        c["model"]["vocab"].update({f"extra{i}": 100 + i for i in range(100)})

    edit_json(grow)(p)


def without_eos(p):
    def drop(c):
        c["model"]["vocab"].pop("<eos>")
        c["added_tokens"] = [t for t in c["added_tokens"] if t["content"] != "<eos>"]

    edit_json(drop)(p)


ARCH_OVERRIDES = FAULT_ARCHS
ALL = tuple(ARCH_OVERRIDES)
# (name, file, fault, archs, exception, message)
FAULTS = [
    ("weights truncated to half", W, truncate(0.5), ALL, ValueError, "corrupt checkpoint"),
    ("weights empty", W, truncate(0), ALL, ValueError, "corrupt checkpoint"),
    ("weights cut after 8 bytes", W, truncate(8), ALL, ValueError, "corrupt checkpoint"),
    ("weights missing their last byte", W, truncate(-1), ALL, ValueError, "corrupt checkpoint"),
    ("weights replaced by garbage", W, write(bytes(range(256)) * 8), ALL, ValueError, "corrupt checkpoint"),
    ("weights with a header byte flipped", W, flip(12), ALL, ValueError, "corrupt checkpoint"),
    ("weights with a data byte flipped", W, flip(-3), ALL, ValueError, "checksum"),
    ("weights replaced by a pickle", W, write(pickle.dumps({"embed.W_E": [0.0]})), ALL, ValueError, "corrupt checkpoint"),
    (
        "weights replaced by torch.save",
        W,
        lambda p: torch.save({"embed.W_E": torch.zeros(2)}, p),
        ALL,
        ValueError,
        "corrupt checkpoint",
    ),
    ("weights holding NaN", W, nan_weight, ALL, ValueError, "NaN or inf"),
    ("weights of another size", W, other_size, ALL, ValueError, r"does not match the config .*embed\.W_E is \["),
    ("weights missing", W, remove, ALL, FileNotFoundError, "missing"),
    ("weights a directory", W, a_directory, ALL, FileNotFoundError, "missing"),
    ("config missing", C, remove, ALL, FileNotFoundError, "missing"),
    ("config empty", C, write(""), ALL, ValueError, "corrupt JSON"),
    ("config not JSON", C, write("{not json"), ALL, ValueError, "corrupt JSON"),
    ("config binary", C, write(b"\xff\xfe\x00\x01"), ALL, ValueError, "corrupt JSON"),
    ("config nested too deep", C, write("[" * 100_000 + "]" * 100_000), ALL, ValueError, "corrupt JSON"),
    ("config a list", C, write("[1, 2]"), ALL, ValueError, "must hold a JSON object"),
    ("config without arch", C, edit_json(lambda c: c.pop("arch")), ALL, ValueError, "no 'arch' field"),
    ("config without model", C, edit_json(lambda c: c.pop("model")), ALL, ValueError, "no 'model' field"),
    ("config arch unknown", C, edit_json(lambda c: c.update(arch="gpt")), ALL, ValueError, "unknown architecture 'gpt'"),
    ("config arch a list", C, edit_json(lambda c: c.update(arch=["fbt"])), ALL, ValueError, r"unknown architecture \['fbt'\]"),
    ("config arch of another model", C, other_arch, ALL, ValueError, "does not match the config|unknown config field"),
    ("config model a string", C, edit_json(lambda c: c.update(model="debug")), ALL, ValueError, "must be a JSON object, got str"),
    ("config unknown field", C, edit_model(d_modle=3), ALL, ValueError, "unknown config field 'd_modle'"),
    ("config n_layers 'two'", C, edit_model(n_layers="two"), ALL, ValueError, "n_layers='two': expected int"),
    ("config n_heads null", C, edit_model(n_heads=None), ALL, ValueError, "n_heads=None: expected int"),
    ("config norm_eps NaN", C, edit_model(norm_eps=float("nan")), ALL, ValueError, "norm_eps=nan: expected float"),
    ("config d_model not the weights'", C, edit_model(d_model=64), ALL, ValueError, r"does not match the config .*embed\.W_E"),
    ("config of an absurd size", C, edit_model(d_model=2**40, n_heads=2**30), ALL, ValueError, "bad model config"),
    (
        "config of a size torch cannot describe",
        C,
        edit_model(d_model=10**30, n_heads=2, n_kv_heads=2),
        ALL,
        ValueError,
        "bad model config .*a size torch cannot allocate",
    ),
    # sizes no machine holds: named from the config alone, before the weights are read
    (
        "config n_layers 10^9",
        C,
        edit_model(n_layers=10**9),
        ALL,
        ValueError,
        r"bad model config .*: n_layers=1000000000: .*more than",
    ),
    ("config d_vocab 10^18", C, edit_model(d_vocab=10**18), ALL, ValueError, r"bad model config .*: d_vocab=10{18}: .*more than"),
    ("config n_streams 10^18", C, edit_model(n_streams=10**18), ("hd",), ValueError, r"n_streams=10{18}: .*more than"),
    (
        "config cross_window 10^20",
        C,
        edit_model(cross_window=10**20),
        ("hd",),
        ValueError,
        r"bad model config .*cross_window=10{20}: a size torch cannot allocate",
    ),
    ("config fusion unknown", C, edit_model(fusion="concat"), ("fbt",), ValueError, "fusion='concat'"),
    (
        "config cross_layers an int",
        C,
        edit_model(cross_layers=1),
        ("hd",),
        ValueError,
        r"cross_layers=1: expected tuple\[int, \.\.\.\] \| None",
    ),
    ("config n_streams zero", C, edit_model(n_streams=0), ("hd",), ValueError, "n_streams=0"),
    ("tokenizer missing", T, remove, ALL, FileNotFoundError, "no tokenizer"),
    ("tokenizer not JSON", T, write("{bad"), ALL, ValueError, "corrupt tokenizer file"),
    ("tokenizer an empty object", T, write("{}"), ALL, ValueError, "corrupt tokenizer file"),
    ("tokenizer with ids past d_vocab", T, more_ids, ALL, ValueError, "does not match the model .*d_vocab is 128"),
    ("tokenizer without <eos>", T, without_eos, ALL, ValueError, "no special token '<eos>'"),
]
CASES = [pytest.param(arch, *fault, id=f"{arch}: {fault[0]}") for fault in FAULTS for arch in fault[3]]


HOSTILE = tally("hostile model files")
SIZES = {"config n_layers 10^9", "config d_vocab 10^18", "config n_streams 10^18", "config cross_window 10^20"}


@pytest.mark.parametrize("arch,name,file,fault,archs,error,match", CASES)
def test_a_corrupt_checkpoint_names_the_file_and_the_problem(
    pristine, tmp_path, no_unpickling, arch, name, file, fault, archs, error, match
):
    run = shutil.copytree(pristine[arch], tmp_path / "run")
    fault(run / file)
    COUNTS["faults_injected"] += 1
    HOSTILE["faults_injected"] += name in SIZES
    loader = CharTokenizer.load if file == T else load_model
    with pytest.raises(error, match=match) as info:
        loader(run)
    assert str(run / file) in str(info.value) and "\n" not in str(info.value)
    if name != "tokenizer missing":  # the CLI falls back to the default tokenizer, by design
        assert_usage_error(["generate", str(run), "--prompt", "ab", "--max-new-tokens", "1"], str(run / file), match=match)


def test_legacy_weights_without_a_checksum_still_load(pristine, tmp_path, no_unpickling):
    run = shutil.copytree(pristine["fbt"], tmp_path / "run")
    save_file(load_file(str(run / W)), str(run / W), metadata={"arch": "fbt"})
    with torch.no_grad():
        assert torch.equal(load_model(run)(tokens(1, 6)), load_model(pristine["fbt"])(tokens(1, 6)))


@settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(0, 10**6), position=st.integers(0, 10**6), value=st.integers(1, 255))
def test_any_torn_or_altered_weights_file_loads_identically_or_fails_naming_it(
    pristine, tmp_path, no_unpickling, cut, position, value
):
    """Property: a weights file with one byte altered and/or cut short either loads the same
    tensors or raises ValueError naming the file: never a crash, never different weights."""
    path = tmp_path / "run" / W
    shutil.copytree(pristine["fbt"], path.parent, dirs_exist_ok=True)
    data = bytearray((pristine["fbt"] / W).read_bytes())
    data[position % len(data)] ^= value
    path.write_bytes(bytes(data[: len(data) - cut % 64]))
    COUNTS["faults_injected"] += 1
    try:
        tensors, _ = load_weights(path)
    except ValueError as err:
        assert str(path) in str(err)
    else:
        original, _ = load_weights(pristine["fbt"] / W)
        assert tensors.keys() == original.keys() and all(torch.equal(tensors[k], original[k]) for k in tensors)
