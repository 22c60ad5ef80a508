"""``probes`` (the FBT paper: recurrent prefill exposes global state at layer 0): ``baseline`` and
``fbt`` at the zoo's settings; per seed a linear probe of the task's state label (the organism's:
the flip-flop's stored bit, the permutation's running product, addition's carry) on the input to
block 0 (FBT's fused input), under standard prefill and under recurrent prefill with K = 2 passes
(FBT), on the same held-out sequences."""

from __future__ import annotations

from pathlib import Path

from workbench.experiments.studies.common import Member, add_paired, interval_text, torch_threads
from workbench.storage.files import read_json
from workbench.training.intervals import ACCURACY, ACCURACY_DIFFERENCE, seed_interval
from workbench.training.zoo import SCALES

PROBE_HOOK = "blocks.0.hook_resid_pre"  # the input to block 0 (FBT's fused input)
PROBE_PASSES = 2  # the recurrent prefill's passes (the 2-pass objective's)
PROBE_SEQUENCES = 400  # held-out sequences per run (the probe verb's default)


def members(scale: str) -> list[Member]:
    steps = SCALES[scale]["steps"]
    return [(arch, arch, [f"train.steps={steps}"], None) for arch in ("baseline", "fbt")]


def measure(models: dict, out: Path, scale: str, threads: int, jobs: int) -> dict:
    return layer0_probes(models, out, probe_target(scale), threads * jobs)


def probe_target(scale: str) -> str:
    """The state label a scale's probes read: its organism's (``tasks.LABELS``); on a zoo of the
    mix, the flip-flop's stored bit."""
    from workbench.data.tasks import LABELS

    return LABELS[SCALES[scale].get("task", "flipflop")][0]


def layer0_probe(run: Path, target: str) -> dict[str, dict]:
    """One run's layer-0 probe of ``target`` (``probe_study`` on ``PROBE_HOOK``, written to its
    ``results/probe_layer0_TARGET.json``, read back on a rerun): per prefill regime (``standard``;
    FBT also ``recurrent K=2``) the probe's accuracy, its majority-class chance and selectivity."""
    from workbench.probing.study import probe_study

    path = run / "results" / f"probe_layer0_{target}.json"
    if path.is_file():
        report = read_json(path)
    else:
        report = probe_study(
            run, target, hooks=[PROBE_HOOK], passes=(PROBE_PASSES,), exact=False, n_sequences=PROBE_SEQUENCES,
            report_name=path.name, mdl=False, ranks=(),
        )  # fmt: skip
    return {
        (r["prefill"] if r["prefill"] == "standard" else f"recurrent K={r['passes']}"): {
            k: r[k] for k in ("accuracy", "chance", "selectivity")
        }
        for r in report["rows"]
    }


def layer0_probes(models: dict, out: Path, target: str, threads: int) -> dict:
    """Per member its layer-0 probes (``layer0_probe``) at each seed and, across seeds, each
    regime's accuracy and selectivity with their intervals."""
    with torch_threads(threads):
        measured = {name: layer0_probe(out / name, target) for name in sorted(models)}
    readings = {}
    for member in sorted({row["member"] for row in models.values()}):
        names = sorted((n for n, row in models.items() if row["member"] == member), key=lambda n: int(models[n]["seed"]))
        rows = [measured[n] for n in names]
        readings[member] = {
            "runs": names,
            "target": target,
            "hook": PROBE_HOOK,
            "per_seed": rows,
            **{
                what: {regime: seed_interval([r[regime][what] for r in rows], bounds=bounds) for regime in rows[0]}
                for what, bounds in (("accuracy", ACCURACY), ("selectivity", ACCURACY_DIFFERENCE))
            },
        }
    return readings


def family(readings: dict) -> dict[str, dict]:
    """FBT's layer-0 probe accuracy under recurrent prefill minus under standard prefill and minus
    the baseline's."""
    cells: dict[str, dict] = {}
    if not {"baseline", "fbt"} <= set(readings):
        return cells
    recurrent = f"recurrent K={PROBE_PASSES}"
    fbt, base = readings["fbt"]["accuracy"], readings["baseline"]["accuracy"]
    if recurrent in fbt:
        add_paired(
            cells,
            f"fbt {recurrent} - fbt standard: layer-0 probe accuracy",
            fbt["standard"]["values"],
            fbt[recurrent]["values"],
            ACCURACY_DIFFERENCE,
        )
        add_paired(
            cells,
            f"fbt {recurrent} - baseline: layer-0 probe accuracy",
            base["standard"]["values"],
            fbt[recurrent]["values"],
            ACCURACY_DIFFERENCE,
        )
    return cells


def rows(study: dict) -> list[dict]:
    return [
        {
            "member": key,
            "target": r["target"],
            **{f"{regime} accuracy": interval_text(v) for regime, v in r["accuracy"].items()},
            **{f"{regime} selectivity": interval_text(v) for regime, v in r["selectivity"].items()},
        }
        for key, r in study.get("readings", {}).items()
    ]
