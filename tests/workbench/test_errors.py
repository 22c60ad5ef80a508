"""Bad input gets an error that names the offending value; checkpoints load without pickle."""

import json
import os

import pytest
import torch
from helpers import tokens

from workbench import build_model, generate, load_model, make_config, parse_override, save_model
from workbench.training.runconfig import make_run_config


@pytest.mark.parametrize("bad,match", [(128, "token id 128"), (-1, "token id -1")])
def test_token_ids_outside_the_vocabulary(any_model, bad, match):
    toks = tokens(1, 5)
    toks[0, 2] = bad
    with pytest.raises(ValueError, match=match):
        any_model(toks)


def test_sequences_longer_than_the_context(any_model):
    with pytest.raises(ValueError, match="129 tokens.*n_ctx=128"):
        any_model(tokens(1, 129))
    cache = any_model.make_cache()
    any_model(tokens(1, 100), cache=cache)
    with pytest.raises(ValueError, match=r"100 cached \+ 40 new"):
        any_model(tokens(1, 40), cache=cache)
    with pytest.raises(ValueError, match="max_new_tokens=40.*n_ctx=128"):
        generate(any_model, tokens(1, 100), max_new_tokens=40)


def test_non_integer_or_wrongly_shaped_tokens():
    model = build_model("baseline", "debug")
    with pytest.raises(ValueError, match="dtype torch.float32"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"\[batch, pos\].*\(4,\)"):
        model(torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: build_model("gpt", "debug"), "unknown architecture 'gpt'"),
        (lambda: build_model("fbt", "huge"), "unknown preset 'huge'"),
        (lambda: build_model("fbt", "debug", d_modle=3), "unknown config field 'd_modle'"),
        (lambda: build_model("fbt", "debug", d_model=30), "d_model=30 is not divisible by n_heads=4"),
        (lambda: build_model("fbt", "debug", n_layers=0), "n_layers=0"),
        (lambda: build_model("fbt", "debug", d_model=32.5), "d_model=32.5: expected int"),
        (lambda: build_model("fbt", "debug", fusion="concat"), "fusion='concat'"),
        (lambda: build_model("hd", "debug", n_streams=0), "n_streams=0"),
        (lambda: build_model("hd", "debug", cross_layers=(5,)), "layer 5 is not in"),
        (lambda: build_model("hd", "debug", positions="random"), "positions='random'"),
        (
            lambda: make_run_config("hd", "debug", "modsum", ["model.kv_mirror=1", "hd.supervise=all"]),
            "model.kv_mirror=1 with hd.supervise=all",
        ),
        (lambda: parse_override("fbt", "d_model"), "malformed override 'd_model'"),
        (lambda: parse_override("fbt", "d_model=abc"), "malformed override 'd_model=abc'.*int"),
        (lambda: parse_override("fbt", "width=3"), "unknown config field 'width'"),
    ],
)
def test_bad_configs_name_the_field(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_overrides_are_typed():
    assert parse_override("hd", "cross_layers=0,1") == ("cross_layers", (0, 1))
    assert parse_override("hd", "cross_window=none") == ("cross_window", None)
    assert parse_override("fbt", "init_std=0.01") == ("init_std", 0.01)
    assert make_config("hd", "tiny", **dict([parse_override("hd", "n_streams=4")])).n_streams == 4


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(regime="soft"), "regime 'soft' needs a Full-Bandwidth model"),
        (dict(regime="greedy"), "unknown regime 'greedy'"),
        (dict(passes=0), "passes=0"),
        (dict(max_new_tokens=0), "max_new_tokens=0"),
        (dict(temperature=-1.0), "temperature=-1.0"),
    ],
)
def test_bad_generation_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(build_model("baseline", "debug"), tokens(1, 4), **kwargs)


def test_checkpoint_round_trip(tmp_path, any_model):
    save_model(any_model, tmp_path / "run")
    loaded = load_model(tmp_path / "run")
    toks = tokens(2, 8)
    with torch.no_grad():
        assert torch.equal(loaded(toks), any_model(toks))
    assert type(loaded) is type(any_model) and loaded.cfg == any_model.cfg
    assert not list((tmp_path / "run").glob("*.tmp"))
    mask = os.umask(0)
    os.umask(mask)
    for name in ("model.safetensors", "config.json"):  # written atomically, with normal permissions
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o666 & ~mask


def test_corrupt_or_missing_checkpoints_name_the_file(tmp_path):
    model = build_model("fbt", "debug")
    run = save_model(model, tmp_path / "run")
    weights = run / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="corrupt checkpoint .*model.safetensors"):
        load_model(run)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(run)
    weights.write_bytes(good)
    config = json.loads((run / "config.json").read_text())
    config["model"]["d_modle"] = 3
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json.*d_modle"):
        load_model(run)
    config["model"].pop("d_modle")
    config["model"]["d_model"] = 64
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="does not match the config"):
        load_model(run)
    (run / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt JSON in .*config.json"):
        load_model(run)
    with pytest.raises(FileNotFoundError, match="no run directory"):
        load_model(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "fbt:debug", "--prompt", "Q", "--temperature", "nan"], "temperature=nan: expected a finite number >= 0"),
        (
            ["cache", "baseline:debug", "--task", "modsum", "--hooks", "hook_embed", "--n", "0", "--out", "STORE"],
            "no examples to cache",
        ),
        (["zoo", "--only", "bogus", "--out", "ZOO"], "unknown zoo member(s) ['bogus']"),
        (["dynamics", "RUN", "--starts", "1", "--out", "DYN"], "starts=1: expected 2..4096"),
        (["dynamics", "RUN", "--spectra", "-2", "--out", "DYN"], "spectra=-2: expected 1..300 (at most one per step)"),
        # sizes that would run until memory or time runs out are bounded before any work
        (["dynamics", "RUN", "--horizon", "1000000000", "--out", "DYN"], "horizon=1000000000: expected 1..100,000 steps"),
        (["dynamics", "RUN", "--starts", "1000000000", "--out", "DYN"], "starts=1000000000: expected 2..4096"),
        (["dynamics", "RUN", "--fp-steps", "1000000000", "--out", "DYN"], "fp_steps=1000000000: expected 2..100,000"),
        (["dynamics", "RUN", "--max-passes", "1000000000", "--out", "DYN"], "max_passes=1000000000: expected 2..256"),
        (["traces", "RUN", "--task", "chain", "--n", "1000000000", "--out", "DYN"], "n_problems=1000000000: expected 1..100,000"),
        (
            ["traces", "RUN", "--difficulty", "1..1000000000", "--out", "DYN"],
            "expected steps like 1..4 or 1,3,5 within 1..64, got '1..1000000000'",
        ),
        (
            ["cache", "baseline:debug", "--task", "modsum", "--hooks", "hook_embed", "--n", "1000000000", "--out", "STORE"],
            "1000000000 modsum examples requested: expected 0..1,000,000",
        ),
        (["eval", "SAVED", "--n", "1000000000"], "n=1000000000: expected 1..1,000,000 examples per task"),
        (
            ["train", "--out", "STORE", "--set", "data.n_train=1000000000"],
            "1000000000 mix examples requested: expected 0..1,000,000",
        ),
        (
            ["train", "--out", "STORE", "--set", "data.chain_max_steps=1000000000"],
            "data field chain_max_steps=1000000000: expected at most 64",
        ),
    ],
)
def test_settings_no_work_can_use_are_named_before_anything_is_written(tmp_path, argv, message, capsys):
    from workbench.cli import main

    saved = save_model(build_model("baseline", "debug"), tmp_path.parent / f"{tmp_path.name}-saved")
    fbt = save_model(build_model("fbt", "debug"), tmp_path.parent / f"{tmp_path.name}-fbt")  # RUN: a run, checked first
    named = {"SAVED": saved, "RUN": fbt}
    argv = [str(tmp_path / a) if a in ("STORE", "ZOO", "DYN") else str(named[a]) if a in named else a for a in argv]
    before = sorted(p.name for p in saved.rglob("*"))
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no output directory was created
    assert sorted(p.name for p in saved.rglob("*")) == before


def test_eval_names_the_config_file_with_a_bad_training_section(tmp_path, capsys):
    from workbench.cli import main
    from workbench.training.runconfig import make_run_config

    run = save_model(build_model("baseline", "debug"), tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config.update({k: v for k, v in make_run_config("baseline", "debug", "chain").to_dict().items() if k != "model"})
    config["train"]["steps"] = "ten"
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exit_:
        main(["eval", str(run)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and str(run / "config.json") in err and "train.steps" in err, err


# ---- sizes known before anything is allocated --------------------------------------------

SIZE_CASES = [
    ("baseline", {}),
    ("baseline", {"tie_embeddings": False, "n_kv_heads": 2}),
    ("fbt", {}),
    ("fbt", {"fusion": "add", "tie_embeddings": False}),
    ("hd", {"n_streams": 1}),
    ("hd", {"n_streams": 3}),
    ("hd", {"n_streams": 4, "n_kv_heads": 1, "tie_embeddings": False, "kv": "shared"}),
]


@pytest.mark.parametrize("preset", ["debug", "tiny"])
@pytest.mark.parametrize("arch,overrides", SIZE_CASES, ids=lambda v: str(v))
def test_the_parameter_count_from_a_config_is_the_models_exactly(arch, overrides, preset):
    from workbench.runtime.config import model_bytes, parameter_count

    model = build_model(arch, preset, **overrides)
    count = sum(p.numel() for p in model.parameters())
    assert parameter_count(model.cfg) == count
    assert model_bytes(model.cfg) == sum(p.numel() * p.element_size() for p in model.parameters()) == 4 * count
    assert model_bytes(model.cfg, 2) == 2 * count


def test_a_config_past_the_memory_is_refused_by_every_build_naming_the_field(tmp_path, monkeypatch):
    """Building from a preset with overrides, loading a run, importing: each estimates the model from
    its config and refuses one that needs more memory than there is, naming the field that makes it
    large, before it allocates (the patched builders would fail the test)."""
    from pretrained import hf_llama

    import workbench.runtime.config as config
    from workbench.runtime.importing import import_hf

    run = save_model(build_model("hd", "debug", n_streams=2), tmp_path / "run")
    hf_llama(tmp_path / "hf")
    budget = 4 * sum(p.numel() for p in build_model("hd", "debug", n_streams=2).parameters()) * 2  # two copies fit
    monkeypatch.setattr(config, "memory_available", lambda device=None: (budget, "a test's budget"))
    assert isinstance(load_model(run), torch.nn.Module)  # within the budget: nothing changes
    built = []
    monkeypatch.setattr(config.ARCHS["hd"][1], "__init__", lambda *a, **k: built.append(a))
    with pytest.raises(ValueError, match=r"^n_streams=400: the model's [\d,]+ parameters need .* more than the .* available"):
        build_model("hd", "debug", n_streams=400)
    with pytest.raises(ValueError, match=r"^d_vocab=100000: "):
        build_model("hd", "debug", d_vocab=100_000)
    config_path = run / "config.json"
    saved = json.loads(config_path.read_text())
    saved["model"]["n_layers"] = 10_000
    config_path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=rf"^bad model config in {config_path}: n_layers=10000: .*\(2 copies\) need"):
        load_model(run)
    assert built == []
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**hf_config, "intermediate_size": 1_000_000}))
    with pytest.raises(ValueError, match=r": intermediate_size=1000000: the model's .*\(2 copies\) need"):
        import_hf(tmp_path / "hf", tmp_path / "imported")
    assert not (tmp_path / "imported").exists()


def test_the_memory_available_is_read_from_the_machine():
    from workbench.runtime.config import memory_available

    available, source = memory_available()
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines())
    total = int(meminfo["MemTotal"].split()[0]) * 1024 + int(meminfo.get("SwapTotal", "0 kB").split()[0]) * 1024
    assert 0 < available <= total and source
