"""The organisms' pages: a page per comparison study on each model organism whose JSON is in the
results folder (``organism_pages``; scripts/regenerate_organisms.py writes them), among them the
layer-0 probes and trace-length studies, which only the organisms have, and the claims page: each
seed paper's claim read on each organism, with its verdict (``claims.json``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from .render import Page, crossed, fixed, render, seed_cell, table
from .stability import stability
from .studies import family_section, fbt_vs_baseline, hd_ablations, three_pass


def layer0_probes_body(study: dict) -> list[str]:
    readings = study["readings"]
    rows = [
        [
            f"`{member}`",
            regime,
            seed_cell(r["accuracy"][regime]["values"], bounds=(0.0, 1.0)),
            seed_cell(r["selectivity"][regime]["values"], bounds=(-1.0, 1.0)),
            ", ".join(fixed(seed[regime]["chance"], 3) for seed in r["per_seed"]),
        ]
        for member, r in readings.items()
        for regime in r["accuracy"]
    ]
    target, hook = next(iter(readings.values()))["target"], next(iter(readings.values()))["hook"]
    return [
        f"## A linear probe of `{target}` on `{hook}`, {study['seeds']} seeds",
        "",
        "Per member and prefill regime, the probe's held-out accuracy and selectivity (accuracy minus a",
        "control task's, Hewitt and Liang), each mean [95% Student-t interval over seeds] then the seeds'",
        "values, and the majority-class chance per seed. Recurrent prefill feeds each position the last",
        "layer's state of the pass before, so the input to block 0 can hold what the sequence so far implies.",
        "",
        table(["member", "prefill", "accuracy", "selectivity", "chance by seed"], rows),
        *family_section(study.get("family", {})),
    ]


def layer0_probes(name: str) -> Page:
    """The ``probes`` study (``workbench.experiments.studies.probes.layer0_probes``) on one organism."""
    return Page((name,), "Layer-0 probes: `{scale}` at {seeds} seeds (measured)", layer0_probes_body)


def trace_lengths_body(study: dict) -> list[str]:
    readings = study["readings"]
    rows = [
        [f"`{pair}`", crossed(g["trace_tokens"], 1, sign=False), crossed(g["accuracy"], sign=False)]
        for pair, g in readings["groups"].items()
    ]
    return [
        f"## Trace length and accuracy on `{readings['task']}`, {study['seeds']} seeds x {readings['problems']} problems",
        "",
        "Every seed's baseline and FBT answer the same held-out problems (a problem some run had no room",
        "for is left out of all); each cell: mean [95% interval over seeds and problems crossed].",
        "",
        table(["member/regime", "trace tokens", "accuracy"], rows),
        *family_section(study.get("family", {})),
    ]


def trace_lengths(name: str) -> Page:
    """The ``traces`` study (``workbench.experiments.studies.traces.trace_lengths``) on one organism."""
    return Page((name,), "Trace lengths: `{scale}` at {seeds} seeds (measured)", trace_lengths_body)


ORGANISM_STUDIES: dict[
    str, Callable[[str], Page | Callable[[Path], Page]]
] = {  # scripts/regenerate_organisms.py writes each study on each organism
    "fbt-vs-baseline": fbt_vs_baseline,
    "three-pass": three_pass,
    "hd-ablations": hd_ablations,
    "probes": layer0_probes,
    "traces": trace_lengths,
    "stability": stability,  # a finding of its own, no claim of the papers
}
ORGANISM_NAMES = ("flipflop", "perm", "addition")  # workbench.experiments.claims.ALL
CLAIMS_JSON = "claims.json"


def organism_study_name(study: str, organism: str) -> str:
    """The JSON of ``study`` on ``organism`` in docs/results (``study_fbt_vs_baseline_org_perm.json``)."""
    return f"study_{study.replace('-', '_')}_org_{organism}.json"


def organism_pages(results: Path) -> dict[str, tuple[str, Page | Callable[[Path], Page]]]:
    """A page per organism study whose JSON is in ``results``, and the claims page once the
    claims table is there: each with its line in the index."""
    pages: dict[str, tuple[str, Page | Callable[[Path], Page]]] = {}
    for study, page in ORGANISM_STUDIES.items():
        for organism in ORGANISM_NAMES:
            name = organism_study_name(study, organism)
            if (results / name).is_file():
                pages[name.replace(".json", ".md")] = (f"the {study} study on the {organism} organism", page(name))
    if (results / CLAIMS_JSON).is_file():
        pages["claims.md"] = ("the seed papers' claims read on the organisms, one verdict per claim and organism", claims)
    return pages


def claims(results: Path) -> Page:
    """The claims page, which links each row's study to its page where the study's JSON is in ``results``."""

    def cell(row: dict) -> str:
        if row.get("difference") is None:
            return "-"
        return f"{row['difference']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}]"

    def source(row: dict) -> str:
        name = organism_study_name(row["study"], row["organism"])
        return f"[{row['study']}]({name.replace('.json', '.md')})" if (results / name).is_file() else row["study"]

    def body(data: dict) -> list[str]:
        rows = [
            [
                row["paper"],
                row["says"],
                row["organism"],
                source(row),
                row["comparison"] or "-",
                cell(row),
                f"{row['mde']:.3f}" if row.get("mde") is not None else "-",
                f"{row['paper_effect']:.3f}" if row.get("paper_effect") is not None else "-",
                f"**{row['verdict']}**",
                row["why"],
            ]
            for row in data["rows"]
        ]
        return [
            "## The claims",
            "",
            "Each claim of the seed papers on each organism, read from the study that tests it: the comparison",
            "of the study's declared family, its mean difference [95% interval simultaneous over the family,",
            "Bonferroni; Holm's adjusted p decides what is detectable], the minimum detectable effect (mde: the",
            "interval's half-width, the smallest difference the study could have called), the largest effect",
            "the paper reports in the comparison's units where it reports one (an mde above it reads",
            "'inconclusive at this power') and the verdict (`workbench/experiments/claims.py`; docs/claims.md",
            "says what each means).",
            "",
            table(
                ["paper", "claim", "organism", "study", "comparison", "difference", "mde", "paper's effect", "verdict", "why"],
                rows,
            ),
            *made_under_section(data.get("made_under")),
            *took_section(data.get("took")),
        ]

    return Page((CLAIMS_JSON,), "The seed papers' claims on the model organisms (measured)", body)


def made_under_section(made_under: dict | None) -> list[str]:
    """Which training fingerprint each result behind the table was made under (scripts/
    regenerate_organisms.py): a study's is its organism's own (the hash of that organism's members'
    digests), the zoo's the whole; results made in parts, at several commits, are one regeneration
    where each organism's share one."""
    if not made_under:
        return []
    groups: dict[tuple[str, str | None], list[str]] = {}
    for name, fingerprint in made_under.items():
        stem = name.removesuffix(".json")
        organism = stem.rpartition("_org_")[2] if "_org_" in stem else "all three (the zoo)"
        groups.setdefault((organism, fingerprint), []).append(f"`{stem}`")
    rows = [
        [
            organism,
            f"`{f[:12]}`" if f else "not recorded (made outside the script, or before fingerprints were)",
            ", ".join(names),
        ]
        for (organism, f), names in groups.items()
    ]
    counts = Counter(organism for organism, f in groups if f is not None)
    unrecorded = sum(len(names) for (_, f), names in groups.items() if f is None)
    return [
        "## What trained them",
        "",
        "The zoo and the studies take hours on 2 cores, so they are made in parts, at more than one commit.",
        "Each part records the training fingerprint of its code (`workbench.training.fingerprint`: the",
        "weights and readings of a few steps of every kind of member on every organism, hashed, and each",
        "organism's members hashed alone), so parts with one fingerprint were trained by the same code, bit",
        "for bit. A study trains one organism's members, so it is read under its organism's own.",
        (
            "The results behind this table were made under "
            + ", ".join(f"{n} fingerprint{'s' if n != 1 else ''} for {o}" for o, n in counts.items())
            + (f", and {unrecorded} without one recorded." if unrecorded else ".")
        ),
        "",
        table(["organism", "training fingerprint", "results"], rows),
    ]


def took_section(took: dict | None) -> list[str]:
    """How long the step that made each result ran, and their sum: what regenerating them all in
    parts costs on the machine that made them (scripts/regenerate_organisms.py records each)."""
    if not took:
        return []
    known = {name: s for name, s in took.items() if s is not None}
    rows = [[f"`{name.removesuffix('.json')}`", f"{s / 60:.1f}"] for name, s in known.items()]
    rows += [[f"`{name.removesuffix('.json')}`", "not recorded"] for name in took if name not in known]
    return [
        "",
        "## How long they took",
        "",
        (
            f"The steps that made the {len(known)} results with a recorded time ran {sum(known.values()) / 3600:.1f} h "
            "in all (wall clock on the 2 cores of the machine that made them; a step run beside another counts "
            "its own wall clock)."
        ),
        "",
        table(["result", "minutes"], rows),
    ]


def claims_page(results: Path) -> str:
    return render(claims, results)
