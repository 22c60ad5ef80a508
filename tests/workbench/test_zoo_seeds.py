"""The zoo at several training seeds: bitwise reproducible for a fixed thread count, seeds that
differ, and the across-seed intervals computed from the members' own evaluations."""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workbench.storage.files import read_json
from workbench.training.intervals import seed_interval
from workbench.training.zoo import SCALES, across_seeds, seed_name, train_zoo


def test_seed_interval_is_the_student_t_interval():
    """n = 3 values 1, 2, 3: mean 2, sample sd 1, half-width t(0.975, 2) / sqrt(3), where with 2
    degrees of freedom the t quantile has the closed form (2p - 1) sqrt(2 / (4 p (1 - p)))."""
    r = seed_interval([1.0, 2.0, 3.0])
    assert r["mean"] == 2.0 and r["sd"] == 1.0 and r["n"] == 3
    assert math.isclose(r["high"] - 2.0, 0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)) / math.sqrt(3), rel_tol=1e-12)
    assert math.isclose(2.0 - r["low"], r["high"] - 2.0, rel_tol=1e-12)
    one = seed_interval([0.25])
    assert one["low"] == one["high"] == one["mean"] == 0.25
    with pytest.raises(ValueError, match="finite values"):
        seed_interval([1.0, float("nan")])


def test_across_seeds_groups_a_members_seeds_and_skips_single_seed_members():
    row = lambda member, seed, acc: {"member": member, "seed": seed, "tasks": {"chain": {"accuracy": {"standard": acc}}}}
    models = {
        "fbt": row("fbt", 0, 0.25),
        "fbt-seed1": row("fbt", 1, 0.5),
        "fbt-seed2": row("fbt", 2, 0.75),
        "hd2": row("hd2", 0, 0.1),
    }
    result = across_seeds(models)
    assert set(result) == {"fbt"} and result["fbt"]["runs"] == ["fbt", "fbt-seed1", "fbt-seed2"]
    cell = result["fbt"]["tasks"]["chain"]["accuracy"]["standard"]
    assert cell["values"] == [0.25, 0.5, 0.75] and cell["mean"] == 0.5 and cell["low"] < 0.25 < 0.75 < cell["high"]


@pytest.mark.slow
def test_a_zoo_member_is_bitwise_the_same_when_trained_again_and_differs_across_seeds(tmp_path):
    threads = torch.get_num_threads()
    a = train_zoo("micro", tmp_path / "a", progress=False, only=["fbt"], seeds=2)
    train_zoo("micro", tmp_path / "b", progress=False, only=["fbt"], seeds=2)
    assert torch.get_num_threads() == threads  # restored
    assert set(a["models"]) == {"fbt", seed_name("fbt", 1)} == {"fbt", "fbt-seed1"}
    for name in a["models"]:  # (the files' bytes may differ: safetensors writes its metadata in hash order)
        wa, wb = (load_file(tmp_path / x / name / "model.safetensors") for x in "ab")
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    w0, w1 = (load_file(tmp_path / "a" / n / "model.safetensors")["embed.W_E"] for n in ("fbt", "fbt-seed1"))
    assert not torch.equal(w0, w1)
    zoo = read_json(tmp_path / "a" / "zoo.json")
    assert (
        zoo["seeds"] == 2
        and zoo["threads"] == SCALES["micro"]["threads"] == 2
        and zoo["jobs"] == 1
        and zoo["torch"] == torch.__version__
    )
    assert (
        zoo["models"]["fbt-seed1"]["seed"] == 1 and read_json(tmp_path / "a" / "fbt-seed1" / "config.json")["train"]["seed"] == 1
    )
    # one member after another: the zoo's wall-clock holds every member's training and evaluation
    work = sum(m["session_seconds"] + m["eval_seconds"] for m in zoo["models"].values())
    # each is rounded (wall and training to 0.1 s, eval to 0.01 s): allow the sum of the half-units
    # (a loaded machine gave 6.4 against 6.41, the members' own times filling the wall-clock)
    rounding = 0.05 + sum(0.05 + 0.005 for _ in zoo["models"])
    assert zoo["session_wall_seconds"] >= work - rounding
    cell = zoo["across_seeds"]["fbt"]["tasks"]["chain"]["loss"]["standard"]
    losses = [zoo["models"][n]["tasks"]["chain"]["loss"]["standard"] for n in ("fbt", "fbt-seed1")]
    assert cell["values"] == losses and math.isclose(cell["mean"], sum(losses) / 2)
    # recorded again by a zoo that finds it trained: the member keeps its training time (from its
    # metrics log), while this session spent next to none in training
    again = train_zoo("micro", tmp_path / "a", progress=False, only=["fbt"], seeds=1)["models"]["fbt"]
    assert again["train_seconds"] == zoo["models"]["fbt"]["train_seconds"] > 0
    assert again["resumed_from"] == SCALES["micro"]["steps"] and again["session_seconds"] < again["train_seconds"]


def test_logged_seconds_sums_each_windows_steps_at_its_rate(tmp_path):
    """Records at steps 10, 20, 25 with 100, 200 and 50 tokens/s and 10 tokens a step: 10 x 10 / 100
    + 10 x 10 / 200 + 5 x 10 / 50 = 1 + 0.5 + 1 = 2.5 seconds."""
    from workbench.training.metrics import logged_seconds

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {s}, "tokens_per_s": {r}}}\n' for s, r in ((10, 100), (20, 200), (25, 50))))
    assert logged_seconds(path, 10) == 2.5
    assert logged_seconds(tmp_path / "none.jsonl", 10) == 0.0


def test_competence_compares_standard_accuracy_with_each_target():
    from workbench.training.zoo import competence

    tasks = {"chain": {"accuracy": {"standard": 0.5, "soft": 0.9}}, "modsum": {"accuracy": {"standard": 0.79}}}
    c = competence(tasks, {"chain": 0.5, "modsum": 0.8, "flipflop": 0.95})
    assert [c["tasks"][t]["reached"] for t in ("chain", "modsum", "flipflop")] == [True, False, False]
    assert c["tasks"]["flipflop"]["accuracy"] is None and not c["qualified"]
    assert competence(tasks, {"chain": 0.5})["qualified"]
    micro = competence(tasks, None)
    assert micro["plumbing_check"] and not micro["qualified"]


@pytest.mark.slow
def test_members_trained_in_parallel_processes_are_bitwise_those_trained_one_after_another(tmp_path, monkeypatch):
    """``jobs`` = 2: each member in its own spawned process, ``hd2`` (continued from ``baseline``)
    only once the baseline is done; with the same thread count the weights and evaluations are
    those of the sequential zoo. The zoo's bar counts every member's training steps (a
    bar of members alone sits at 0/4 for minutes), never backwards, to the total."""
    import workbench.training.zoo as zoo

    bars = []

    class Recorded(zoo.Bar):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen = []
            bars.append(self)

        def update(self, n, what=None, **kwargs):
            self.seen.append(n)
            super().update(n, what, **kwargs)

    monkeypatch.setattr(zoo, "Bar", Recorded)
    monkeypatch.setattr(zoo, "POLL", 0.05)
    calls = []
    kwargs = dict(only=["baseline", "hd2"], threads=1)
    one = train_zoo("micro", tmp_path / "one", progress=False, jobs=1, **kwargs)
    two = train_zoo("micro", tmp_path / "two", progress=lambda *a: calls.append(a), jobs=2, seeds=2, **kwargs)
    (bar,) = bars
    assert bar.total == 2 * (60 + 20) and bar.seen[-1] == bar.total
    assert bar.seen == sorted(bar.seen) and len(set(bar.seen)) > 4  # steps within members, not members only
    assert two["jobs"] == 2 and two["threads"] == 1 and one["jobs"] == 1
    assert set(two["models"]) == {"baseline", "hd2", "baseline-seed1", "hd2-seed1"}
    assert sorted(calls) == sorted(
        (name, steps, steps, None) for name, steps in [("baseline", 60), ("hd2", 20), ("baseline-seed1", 60), ("hd2-seed1", 20)]
    )
    for name in ("baseline", "hd2"):
        wa, wb = (load_file(tmp_path / x / name / "model.safetensors") for x in ("one", "two"))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
        assert one["models"][name]["tasks"] == two["models"][name]["tasks"]
    assert read_json(tmp_path / "two" / "zoo.json")["models"]["hd2-seed1"]["seed"] == 1


def test_config_differences_name_every_field_but_the_grown_stream_count():
    from workbench.training.zoo import config_differences

    wanted = {
        "arch": "hd",
        "preset": "tiny",
        "model": {"n_streams": 2, "readout": "last", "cross_layers": (2,)},
        "hd": {"streams": (2, 4)},
    }
    grown = {
        "arch": "hd",
        "preset": "tiny",
        "model": {"n_streams": 4, "readout": "last", "cross_layers": [2]},
        "hd": {"streams": [2, 4]},
    }
    assert config_differences(grown, wanted) == []  # the expansion's n_streams; tuples saved as lists
    ablated = {**grown, "model": {**grown["model"], "readout": "sum"}}
    assert config_differences(ablated, wanted) == ["model.readout"]
    assert config_differences({**grown, "arch": "fbt"}, wanted) == ["arch"]


@pytest.mark.parametrize("scale", ["quick", "org-flipflop", "org-perm", "org-addition", "cpu"])
def test_a_zoos_targets_are_the_tasks_its_members_are_evaluated_on(scale):
    from workbench.training.evaluate import eval_tasks
    from workbench.training.zoo import TARGETS, member_config, members

    for name, arch, overrides, init in members(scale, Path("zoo")):
        cfg = member_config(scale, arch, overrides, init)
        assert eval_tasks(cfg.data.task, cfg.data) == list(TARGETS[scale]), name


def test_the_quick_zoo_is_the_flip_flop_organism():
    from workbench.training.zoo import ORGANISMS, member_config, members

    assert ORGANISMS == {"flipflop": "org-flipflop", "perm": "org-perm", "addition": "org-addition"}
    for (name, arch, overrides, init), (_, _, same, _) in zip(members("quick", Path("z")), members("org-flipflop", Path("z"))):
        quick, organism = member_config("quick", arch, overrides, init), member_config("org-flipflop", arch, same, init)
        assert quick.to_dict() == organism.to_dict(), name
    assert quick.data.task == "flipflop" and quick.train.seq_len == 64 and quick.data.flipflop_weights == (0.3, 0.5, 0.2)


def test_the_organisms_refuse_a_summary_they_did_not_write_before_training(tmp_path):
    from workbench.storage.errors import OutputExists
    from workbench.training.zoo import train_organisms

    (tmp_path / "organisms.json").write_text("{}")
    with pytest.raises(OutputExists, match="organisms.json was not written by workbench zoo --preset organisms"):
        train_organisms(tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["organisms.json"]


def test_logged_step_reads_the_last_whole_line_of_a_metrics_log(tmp_path):
    from workbench.training.zoo import logged_step

    assert logged_step(tmp_path) == 0  # no log yet
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 10, "loss": 1.0}\n{"step": 20, "loss": 0.5}\n{"step": 3')  # the last line being written
    assert logged_step(tmp_path) == 20
    log.write_text("".join(f'{{"step": {s}, "loss": 0.1, "note": "{"x" * 300}"}}\n' for s in range(1, 200)))
    assert logged_step(tmp_path) == 199  # read from the end, past the 4 KiB window's cut first line


def test_a_rerun_counts_the_seeds_its_members_were_trained_at_not_those_a_stopped_run_asked_for(tmp_path):
    """A run stopped early at --seeds 5 recorded members at seeds 0 and 1 only; a rerun at --seeds 2
    keeps those members and says 2 seeds, not 5 (its readings are over the members there are)."""
    from workbench.storage.files import write_json
    from workbench.storage.outputs import output
    from workbench.training.zoo import ZOO, new_summary, train_plan

    stopped = {**new_summary("micro", 5, 1, 1), "models": {"fbt": {"seed": 0}, "fbt-seed1": {"seed": 1}}}
    with output(tmp_path, ZOO) as held:
        write_json(tmp_path / "zoo.json", stopped)
        held.wrote(tmp_path / "zoo.json")
    summary = train_plan(
        [], tmp_path, tmp_path / "zoo.json", new_summary("micro", 2, 1, 1), scale="micro", threads=1, progress=False
    )
    assert summary["seeds"] == 2 and sorted(summary["models"]) == ["fbt", "fbt-seed1"]
    summary = train_plan(
        [], tmp_path, tmp_path / "zoo.json", new_summary("micro", 1, 1, 1), scale="micro", threads=1, progress=False
    )
    assert summary["seeds"] == 2  # --only at one seed keeps the members of the others
    with output(tmp_path, ZOO) as held:  # stopped before any member was recorded
        write_json(tmp_path / "zoo.json", new_summary("micro", 5, 1, 1))
    assert (
        train_plan([], tmp_path, tmp_path / "zoo.json", new_summary("micro", 3, 1, 1), scale="micro", threads=1, progress=False)[
            "seeds"
        ]
        == 3
    )
