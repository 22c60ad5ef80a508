"""Zoo and studies: the seeds' claims on the model organisms (``workbench.experiments.claims``), each zoo's members across training seeds (accuracy with its 95% interval,
competence), its probes, dynamics and traces across seeds where they were run
(``scripts/zoo_analyses.py``), and each comparison study's readings (``workbench zoo --study``)."""

from pathlib import Path

import pandas as pd
import streamlit as st

from app.charts import member_accuracy
from app.state import runs_root, shown_errors
from workbench.experiments.claims import claims_from
from workbench.experiments.comparisons import family_rows, interval_text, reading_rows
from workbench.experiments.seed_readings import zoo_readings
from workbench.storage.errors import BadInput
from workbench.storage.files import read_json
from workbench.training.zoo import seed_rows

MAX_SEEDS = 1000  # a zoo.json claiming more is not one the workbench wrote (each seed is a trained zoo)

st.title("Zoo and studies")
root = runs_root()


def read_summary(path: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame | None, pd.DataFrame | None]:
    """The ``zoo.json`` or ``study.json`` at ``path``, its members' rows and (a study's) readings and family;
    ``BadInput`` naming the file and what in it is wrong when it is not what ``workbench zoo``
    writes (the page shows that, and the other summaries stay selectable)."""
    summary = read_json(path)
    seeds, study = summary.get("seeds", 1), summary.get("study")
    if type(seeds) is not int or not 1 <= seeds <= MAX_SEEDS:
        raise BadInput(f"{path}: field 'seeds' must be a whole number from 1 to {MAX_SEEDS}, got {seeds!r:.60}")
    if study is not None and not isinstance(study, str):
        raise BadInput(f"{path}: field 'study' must be a string, got {study!r:.60}")
    try:
        rows = pd.DataFrame(seed_rows(summary))
        readings = pd.DataFrame(reading_rows(summary)) if study else None
        family = pd.DataFrame(family_rows(summary)) if study else None
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as err:
        raise BadInput(f"{path} is not a summary that `workbench zoo` writes: {type(err).__name__}: {err}") from None
    return summary, rows, readings, family


def summaries(root: Path) -> dict[str, Path]:
    """Every ``zoo.json`` and ``study.json`` at most four levels under ``root`` (an organism's study:
    ``organisms/TASK/studies/STUDY``), by relative path."""
    found = {}
    for depth in ("", "*/", "*/*/", "*/*/*/", "*/*/*/*/"):
        for name in ("zoo.json", "study.json"):
            for path in sorted(root.glob(depth + name)):
                found[str(path.parent.relative_to(root)) or "."] = path
    return found


if (root / "organisms").is_dir():
    st.subheader("The seeds' claims on the model organisms")
    table = pd.DataFrame(claims_from(root / "organisms"))
    # a static table: its cells wrap, where a dataframe cuts the claim and its 'why' short
    st.table(table[["paper", "says", "organism", "verdict", "why", "study", "comparison"]].set_index("paper"))
    st.caption(
        f"One row per claim and organism, read from the studies under {root / 'organisms'} (`workbench zoo --study "
        "STUDY --preset org-TASK`): the comparison of the study's declared family, its simultaneous interval and "
        "Holm's reading; 'not testable here' when an arm of the comparison did not learn its task, the claim sits at "
        "a ceiling, or the readout cannot reach significance at this many seeds (docs/claims.md)."
    )

found = summaries(root)
if not found:
    st.info(
        f"No zoo.json or study.json under {root}. Train a zoo on the Runs page, or run "
        "`workbench zoo --preset cpu --seeds 3` / `workbench zoo --study three-pass` and reload."
    )
    st.stop()

where = st.selectbox(
    "Zoo or study", list(found), key="summary", format_func=lambda k: f"{root.name} (this directory)" if k == "." else k
)
summary = None
with shown_errors(f"Reading {found[where]}"):
    summary, rows, readings, family = read_summary(found[where])
if summary is None:
    st.stop()

study = summary.get("study")
seeds = summary.get("seeds", 1)
st.caption(
    f"{'Study ' + study if study else 'Zoo'} · preset `{summary.get('scale')}` · {seeds} training seed(s) · "
    f"{summary.get('threads')} threads · torch {summary.get('torch')} · commit `{summary.get('commit')}`"
)
if rows.empty:
    st.info("No member has finished yet.")
    st.stop()
if bool((rows["qualified seeds"] == "plumbing check").any()):
    st.warning(
        "This is the micro zoo: a plumbing check trained for seconds. Its numbers exercise every page "
        "but say nothing about the effects studied."
    )

if study:
    st.subheader("Readings")
    st.dataframe(readings, hide_index=True)
    st.caption("Each cell: mean [95% Student-t interval] across training seeds; one seed gives the value alone.")
    if study == "hd-ablations":
        st.caption(
            "But 'step time / hd1': one training step of the seed-0 model over hd1's, measured side by side in one "
            "process (the median of interleaved repetitions); 'time / hd1' is from the runs' own training logs."
        )
    if family is not None and not family.empty:
        st.subheader(f"The declared family of {len(family)} comparisons")
        st.dataframe(family, hide_index=True)
        st.caption(
            "Each comparison paired by seed; the interval is simultaneous over the family (Bonferroni), the reading "
            "Holm's: an interval through 0, or a Holm-adjusted p of 0.05 or more, is no detectable difference."
        )

st.subheader("Members across seeds")
task = st.radio("Task", sorted(rows["task"].unique()), horizontal=True, key="zoo_task")
shown = rows[rows["task"] == task].assign(  # an accuracy's interval is drawn inside [0, 1]
    low=lambda d: d["low"].astype(float).clip(0, 1), high=lambda d: d["high"].astype(float).clip(0, 1)
)
st.altair_chart(member_accuracy(shown, task).properties(height=320), width="stretch")
st.dataframe(shown, hide_index=True)
st.caption(
    "Points: mean accuracy across seeds; bars: the 95% interval (none with one seed: low and high empty). "
    "'qualified seeds' counts the seeds whose accuracy in that row's regime reached the task's competence target "
    "(docs/training.md); a member qualifies on its standard row."
)

analyses = {}
with shown_errors(f"Reading the analyses under {found[where].parent}"):
    analyses = {} if study else zoo_readings(found[where].parent, seeds)
if analyses:
    st.subheader("Probes, dynamics and traces across seeds")
    group = st.selectbox("Readings", list(analyses), key="zoo_analyses")
    table = [
        {"reading": name, "across seeds": interval_text(r), "seeds": ", ".join(f"{v:.3g}" for v in r["values"])}
        for name, r in analyses[group].items()
    ]
    st.dataframe(pd.DataFrame(table), hide_index=True)
    st.caption(
        "Each reading of every seed's analysis (`python scripts/zoo_analyses.py ZOO --seeds N`): mean [95% "
        "Student-t interval] across seeds, then each seed's value. Only readings every seed has are shown."
    )
