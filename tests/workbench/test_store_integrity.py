"""Activation store integrity: every shard is listed in ``store.json`` with its rows,
bytes and CRC32; loading checks names (confined to the store), sizes, counts and columns always,
and checksums and finiteness with ``verify`` (the default). Each fault is named with the store."""

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import assert_usage_error, cli, tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import build_model
from workbench.data.tasks import synthetic_examples
from workbench.probing.store import cache_activations, load_store

COUNTS = tally("corrupt stores")
HOOKS = ["hook_embed", "blocks.0.hook_resid_post"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A three-shard store and a second, different one (another model and task)."""
    base = tmp_path_factory.mktemp("stores")
    model = build_model("fbt", "debug")
    cache_activations(model, synthetic_examples("modsum", 40, 1), HOOKS, base / "store", batch_size=16)
    cache_activations(
        build_model("baseline", "debug", seed=3), synthetic_examples("flipflop", 40, 2), HOOKS, base / "other", batch_size=16
    )
    return base


def meta_edit(change):
    def edit(store):
        meta = json.loads((store / "store.json").read_text())
        change(meta)
        (store / "store.json").write_text(json.dumps(meta))

    return edit


def shard(i):
    return f"shard-{i:05d}.arrow"


def flip_data_byte(store):  # in the last float of the last shard: the Arrow framing stays valid
    path = store / shard(2)
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x40
    path.write_bytes(bytes(data))


def truncate(store):
    path = store / shard(1)
    path.write_bytes(path.read_bytes()[:-100])


def swap_in_other(other):
    def swap(store):
        shutil.copyfile(other / shard(0), store / shard(0))

    return swap


def rewrite_with_nan(store):
    """A NaN written into a shard whose listing is then made consistent again (a tool that wrote
    NaN and a fresh checksum): only the finiteness check can catch it."""
    from workbench.probing.store import _write_shard

    path = store / shard(0)
    with pa.ipc.open_stream(pa.OSFile(str(path))) as reader:
        table = reader.read_all()
    column = table.column("act.hook_embed").combine_chunks()
    values = column.flatten().to_numpy(zero_copy_only=False).copy()
    values[5] = np.nan
    table = table.set_column(
        table.schema.get_field_index("act.hook_embed"),
        "act.hook_embed",
        pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), column.type.list_size),
    )
    entry = _write_shard(path, table)
    meta_edit(lambda m: m["shards"].__setitem__(0, entry))(store)


def symlink_out(store):
    outside = store.parent / "outside.arrow"
    shutil.copyfile(store / shard(0), outside)
    (store / shard(0)).unlink()
    os.symlink(outside, store / shard(0))


FAULTS = [  # (name, fault, message) — message is what the error must say, after the store's name
    ("a flipped byte in a shard", flip_data_byte, "shard shard-00002.arrow does not match its CRC32"),
    ("a truncated shard", truncate, r"shard shard-00001.arrow has \d+ bytes, store.json says \d+"),
    ("a shard of another store swapped in", lambda s: None, ""),  # replaced below
    (
        "store.json claiming 999,999 rows",
        meta_edit(lambda m: m.update(n_rows=999_999)),
        r"the shards hold 549 rows, store.json says n_rows=999999",
    ),
    (
        "a shard claiming other rows",
        meta_edit(lambda m: m["shards"][1].update(rows=5, bytes=m["shards"][1]["bytes"])),
        r"shard shard-00001.arrow holds \d+ rows, store.json says 5",
    ),
    (
        "a shard name with ../",
        meta_edit(lambda m: m["shards"][0].update(name="../outside.arrow")),
        r"shard name '\.\./outside.arrow' .* is not shard-NNNNN.arrow",
    ),
    ("an absolute shard name", meta_edit(lambda m: m["shards"][0].update(name="/etc/passwd")), r"shard name '/etc/passwd'"),
    (
        "a shard that is a symlink out of the store",
        symlink_out,
        "shard shard-00000.arrow listed in store.json is missing \\(or not a plain file\\)",
    ),
    ("a missing shard", lambda s: (s / shard(1)).unlink(), "shard shard-00001.arrow listed in store.json is missing"),
    ("NaN activations with a fresh checksum", rewrite_with_nan, "hook hook_embed holds NaN or inf in shard shard-00000.arrow"),
    ("store.json not JSON", lambda s: (s / "store.json").write_text("{"), "corrupt JSON in .*store.json"),
    (
        "store.json with n_rows a string",
        meta_edit(lambda m: m.update(n_rows="40")),
        "store.json field 'n_rows' is '40', expected int",
    ),
    (
        "store.json with hooks not a list",
        meta_edit(lambda m: m.update(hooks="hook_embed")),
        "store.json field 'hooks' is 'hook_embed', expected list",
    ),
    (
        "store.json naming a hook the shards lack",
        meta_edit(lambda m: m.update(hooks=["hook_embed", "blocks.1.hook_resid_post"])),
        "shard shard-00000.arrow has columns .* store.json needs",
    ),
    ("store.json listing no shards", meta_edit(lambda m: m.update(shards=[], n_rows=0)), "store.json lists no shards"),
    (  # a checksum removed turned verification off; format 2 records one for every shard
        "a shard's crc32 removed from store.json",
        meta_edit(lambda m: m["shards"][2].pop("crc32")),
        r"shard 'shard-00002.arrow' in store.json has no crc32 \(format 2 records them for every shard\)",
    ),
    (
        "a shard replaced by garbage",
        lambda s: (s / shard(0)).write_bytes(b"x" * (s / shard(0)).stat().st_size),
        "does not match its CRC32",
    ),
]


@pytest.mark.parametrize("name,fault,message", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_corrupt_store_fails_naming_the_store_and_the_problem(pristine, tmp_path, name, fault, message):
    store = shutil.copytree(pristine / "store", tmp_path / "store")
    if name == "a shard of another store swapped in":
        fault, message = swap_in_other(pristine / "other"), "shard shard-00000.arrow (has \\d+ bytes|does not match its CRC32)"
    fault(store)
    COUNTS["faults_injected"] += 1
    with pytest.raises(ValueError) as info:
        load_store(store)
    text = str(info.value)
    assert text.startswith(f"corrupt activation store {store}") or str(store / "store.json") in text, text
    assert re.search(message, text) and "\n" not in text, text


def test_sizes_and_counts_are_checked_even_without_verify(pristine, tmp_path):
    store = shutil.copytree(pristine / "store", tmp_path / "store")
    truncate(store)
    COUNTS["faults_injected"] += 1
    with pytest.raises(ValueError, match="has .* bytes"):
        load_store(store, verify=False)
    store = shutil.copytree(pristine / "store", tmp_path / "flipped")
    flip_data_byte(store)
    load_store(store, verify=False)  # the documented trade: checksums only with verify


def test_a_format_1_store_without_shard_entries_still_loads(pristine, tmp_path):
    store = shutil.copytree(pristine / "store", tmp_path / "store")
    meta_edit(lambda m: m.update(shards=[e["name"] for e in m["shards"]], format=1))(store)
    ds, meta = load_store(store)
    assert len(ds) == meta["n_rows"]
    meta_edit(lambda m: m.update(n_rows=m["n_rows"] + 1))(store)
    with pytest.raises(ValueError, match="the shards hold"):
        load_store(store)


@settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(which=st.integers(0, 2), position=st.integers(0, 10**6), value=st.integers(1, 255), cut=st.integers(0, 63))
def test_any_altered_or_torn_shard_loads_identically_or_fails_naming_the_store(pristine, tmp_path, which, position, value, cut):
    store = tmp_path / "store"
    shutil.rmtree(store, ignore_errors=True)
    shutil.copytree(pristine / "store", store)
    path = store / shard(which)
    data = bytearray(path.read_bytes())
    data[position % len(data)] ^= value
    path.write_bytes(bytes(data[: len(data) - cut]))
    COUNTS["faults_injected"] += 1
    try:
        ds, _ = load_store(store)
    except ValueError as err:
        assert str(err).startswith(f"corrupt activation store {store}")
    else:
        original, _ = load_store(pristine / "store")
        assert ds.to_dict() == original.to_dict()


def test_the_cli_writes_a_store_that_verifies_and_refuses_nan_activations(tmp_path):
    argv = [
        "cache",
        "fbt:debug",
        "--hooks",
        "blocks.0.hook_resid_pre",
        "--task",
        "modsum",
        "--n",
        "40",
        "--out",
        str(tmp_path / "store"),
        "--json",
        str(tmp_path / "meta.json"),
    ]
    code, out, err = cli(argv)
    assert code is None, err
    assert re.search(r"storing about [\d,]+ rows, [\d.]+ GiB", out)  # the estimate comes before the work
    meta = json.loads((tmp_path / "meta.json").read_text())
    ds, stored = load_store(tmp_path / "store")
    assert len(ds) == stored["n_rows"] == meta["n_rows"] == sum(s["rows"] for s in stored["shards"])
    estimate = int(re.search(r"storing about ([\d,]+) rows", out).group(1).replace(",", ""))
    assert estimate == stored["n_rows"]

    # NaN from the model: the numerics guard names the sequences and the site (the next norm)
    model = build_model("fbt", "debug")
    model.blocks[0].hook_resid_post.add_hook(lambda x, hook: x.index_fill(1, torch.tensor([3]), float("nan")))
    COUNTS["faults_injected"] += 1
    with pytest.raises(
        RuntimeError,
        match=r"sequence 0: non-finite activation: blocks.1.ln1 input is NaN at step 0, FBT pass 1 .*nothing was stored",
    ):
        cache_activations(model, synthetic_examples("modsum", 40, 1), HOOKS, tmp_path / "nan", batch_size=16)
    assert not (tmp_path / "nan" / "store.json").exists() and not list((tmp_path / "nan").glob(".staging-*"))
    # NaN after the last norm, where no guard looks (a hook on the carried state): refused when written
    model = build_model("fbt", "debug")
    model.ln_final.hook_normalized.add_hook(lambda x, hook: x.index_fill(1, torch.tensor([3]), float("nan")))
    COUNTS["faults_injected"] += 1
    with pytest.raises(
        ValueError, match=r"hook ln_final.hook_normalized holds NaN or inf in sequences 0\.\.15: nothing was stored in"
    ):
        cache_activations(
            model, synthetic_examples("modsum", 40, 1), ["ln_final.hook_normalized"], tmp_path / "nan", batch_size=16
        )


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A real 4 MiB tmpfs (mounting needs root, which this project's machines and CI have)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)]).returncode:
        pytest.skip("mounting a 4 MiB tmpfs needs root")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_store_larger_than_the_free_disk_is_refused_before_writing(tiny_filesystem):
    """The reported case: every hook of ``small`` at the default size needs ~15 GB and was written
    with no estimate. Here 4000 sequences of every residual hook need more than a 4 MiB disk."""
    COUNTS["faults_injected"] += 1
    assert_usage_error(
        [
            "cache",
            "baseline:debug",
            "--task",
            "modsum",
            "--hooks",
            "blocks.*.hook_resid_post",
            "--n",
            "4000",
            "--out",
            str(tiny_filesystem / "store"),
        ],
        "the store would take about",
        "GiB are free under",
        "store fewer hooks",
    )
    assert list(tiny_filesystem.iterdir()) == []
    code, _, err = cli(
        [
            "cache",
            "baseline:debug",
            "--task",
            "modsum",
            "--hooks",
            "hook_embed",
            "--n",
            "20",
            "--out",
            str(tiny_filesystem / "store"),
        ]
    )
    assert code is None, err  # a store that fits is written
