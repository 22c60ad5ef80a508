"""The training fingerprint (workbench.training.fingerprint) that lets a regeneration made in parts
at several commits say which parts were trained by the same code: the weights' digest on a file
whose answer is computed here by hand, and the fingerprint itself repeatable and changed by an
optimizer change of the kind that made the earlier studies irreproducible (fused AdamW)."""

import hashlib
import struct

import pytest
import torch
from safetensors.torch import save_file

from workbench.training import fingerprint


def test_weights_digest_is_the_tensors_by_name_not_the_file(tmp_path):
    tensors = {"b": torch.tensor([1, 2], dtype=torch.int8), "a": torch.tensor([1.0], dtype=torch.float32)}
    save_file(tensors, str(tmp_path / "one.safetensors"), metadata={"made": "first"})
    save_file(dict(reversed(tensors.items())), str(tmp_path / "two.safetensors"), metadata={"made": "second, elsewhere"})
    by_hand = hashlib.sha256(b"a|torch.float32|(1,)|" + struct.pack("<f", 1.0) + b"b|torch.int8|(2,)|\x01\x02").hexdigest()
    assert fingerprint.weights_digest(tmp_path / "one.safetensors") == by_hand
    assert fingerprint.weights_digest(tmp_path / "two.safetensors") == by_hand  # another order, other metadata
    save_file({**tensors, "a": torch.tensor([1.0 + 2**-23])}, str(tmp_path / "three.safetensors"))  # one bit
    assert fingerprint.weights_digest(tmp_path / "three.safetensors") != by_hand


def test_each_organisms_print_hashes_its_own_members_digests_alone():
    digests = {"perm-baseline": "a", "perm-fbt": "b", "flipflop-baseline": "c"}
    by_hand = {
        "perm": hashlib.sha256(b'{"perm-baseline": "a", "perm-fbt": "b"}').hexdigest(),
        "flipflop": hashlib.sha256(b'{"flipflop-baseline": "c"}').hexdigest(),
    }
    assert fingerprint.organism_prints(digests) == by_hand
    assert fingerprint.organism_prints({**digests, "perm-fbt": "B"})["flipflop"] == by_hand["flipflop"]


def test_members_cover_every_kind_the_zoo_trains_on_every_organism(tmp_path):
    from workbench.training.zoo import ORGANISMS

    runs = dict(fingerprint.members(tmp_path))
    assert list(runs) == [f"{task}-{m}" for task in ORGANISMS for m in ("baseline", "fbt", "hd4")]
    for task in ORGANISMS:
        fbt, hd = runs[f"{task}-fbt"], runs[f"{task}-hd4"]
        assert fbt.data.task == task and fbt.fbt.switch == "warm" and fbt.fbt.three_pass_fraction > 0
        assert 0 < fbt.fbt.feedback_start * fbt.train.steps < fbt.train.steps  # both phases run
        assert hd.hd.streams == (2, 4) and hd.init_from == str(tmp_path / f"{task}-baseline")


@pytest.mark.slow
def test_fingerprint_repeats_and_sees_an_optimizer_change(tmp_path, monkeypatch):
    tasks = ("flipflop",)
    first = fingerprint.training_fingerprint(tmp_path / "first", tasks)
    assert fingerprint.training_fingerprint(tasks=tasks) == first  # another directory, the same code
    assert set(first["members"]) == {"flipflop-baseline", "flipflop-fbt", "flipflop-hd4"}
    assert first["organisms"] == fingerprint.organism_prints(first["members"])
    real = torch.optim.AdamW
    monkeypatch.setattr(torch.optim, "AdamW", lambda *a, fused=None, **k: real(*a, foreach=True, **k))  # unfused
    changed = fingerprint.training_fingerprint(tasks=tasks)
    assert changed["sha256"] != first["sha256"]
    assert all(changed["members"][m] != first["members"][m] for m in first["members"])
