"""The stability study's page (``workbench zoo --study stability``): each knob's readings across
seeds beside the member's `standard` accuracy, its declared family, and the seeds each comparison
of the family needs with the run as the pilot of the next."""

from __future__ import annotations

from .render import ACCURACY, Page, fixed, seed_cell, table
from .studies import family_section


def stability_body(study: dict) -> list[str]:
    """The stability study's readings, one row per knob: its `standard` accuracy (whether the member
    learned the task at all), `soft` and `fused` accuracy, lambda(1000) of the carried-state map and
    of the whole step and the K = 8 residual, each mean [95% interval] across seeds."""
    readouts = (("soft accuracy", "accuracy", "soft", ACCURACY), ("fused accuracy", "accuracy", "fused", ACCURACY))
    readouts += (
        ("lambda(1000)", "lyapunov_tangent", "1000", None),
        ("whole-step lambda(1000)", "lyapunov_tangent_full", "1000", None),
    )
    readouts += (("residual K=8", "kpass_residual", "8", None),)

    def standard(run: str) -> float:  # the mean over the member's tasks, as its `soft` and `fused` are
        tasks = study["models"][run]["tasks"].values()
        return sum(t["accuracy"]["standard"] for t in tasks) / len(tasks)

    rows = [
        [
            f"`{member}`",
            seed_cell([standard(run) for run in r["runs"]], 3, bounds=ACCURACY),
            *[seed_cell(r[key][at]["values"], 3, bounds=b) if at in r[key] else "-" for _, key, at, b in readouts],
        ]
        for member, r in study["readings"].items()
    ]
    return [
        "Each member is FBT with one of the seeds' stabilising knobs moved from its default (`fbt`: the",
        "defaults), measured on its own task's held-out problems and prompts; each cell: mean [95%",
        "Student-t interval across seeds] (the seeds' values).",
        "",
        table(["member", "standard accuracy", *[label for label, *_ in readouts]], rows),
    ]


def seeds_needed_section(power: dict | None) -> list[str]:
    """A study's power step with itself as the pilot (``study.json``'s ``power``): per comparison
    its target, the predicted simultaneous half-width at 5 and at 12 seeds, and the seeds it needs."""
    if not power:
        return []
    rows = [
        [
            name,
            f"{plan['target']:g}",
            fixed(plan["predicted"]["5"], 3),
            fixed(plan["predicted"]["12"], 3),
            str(plan["seeds"] or "more than 12"),
        ]
        for name, plan in power["comparisons"].items()
    ]
    return [
        "",
        "## The seeds each comparison needs",
        "",
        "This run as the pilot of the next (`power.power_step`): from the spread of each comparison's",
        "per-seed differences here, the half-width its simultaneous interval is predicted to have at 5 and",
        "at 12 seeds, and the fewest seeds (5 to 12) at which that is at most its target (0.05 of",
        f"accuracy, of lambda, of the residual's share of the state). The most any needs: {power['seeds']}.",
        "",
        table(["comparison", "target", "half-width at 5 seeds", "at 12", "seeds needed"], rows),
    ]


def stability(name: str) -> Page:
    """The stability study's page (``workbench zoo --study stability``): ``name``, its JSON."""
    title = "What makes FBT's feedback decoding work: `{scale}` at {seeds} seeds (measured)"
    return Page(
        (name,), title, lambda s: [*stability_body(s), *family_section(s["family"]), *seeds_needed_section(s.get("power"))]
    )
