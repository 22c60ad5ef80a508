"""Probes: linear probes by depth and prefill regime; the layer-0 comparison first."""

from pathlib import Path

import pandas as pd
import streamlit as st

from app import jobs
from app.charts import probe_depths
from app.state import find, follow, input_warnings, pick_run, run_task, runs, shown_errors, tokenizer, tokenizer_summary
from workbench.probing.study import N_SEQUENCES, TARGET_TASK, default_hooks, default_target
from workbench.storage.errors import BadInput
from workbench.storage.files import read_json


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _count(v) -> bool:
    return type(v) is int and v >= 0


# what the page draws of each row, as ``workbench probe`` writes it: (check, what it must be, required)
ROW = {
    "hook": (lambda v: isinstance(v, str), "a string", True),
    "layer": (lambda v: v is None or _number(v), "a number", True),
    "prefill": (lambda v: isinstance(v, str), "a string", True),
    "passes": (lambda v: type(v) is int or isinstance(v, str), "a whole number or 'exact'", True),
    "stream": (_count, "a whole number", True),
    "accuracy": (_number, "a number", True),
    "chance": (_number, "a number", True),
    "control_accuracy": (_number, "a number", True),
    "selectivity": (_number, "a number", True),
    "n_train": (_count, "a count", True),
    "n_test": (_count, "a count", True),
    "converged": (lambda v: isinstance(v, bool), "true or false", True),
    **{
        name: (lambda v: v is None or _number(v), "a number or null", False)
        for name in ("compression", "control_compression", "mdl_bits", "uniform_bits")
    },
    "rank_sweep": (
        lambda v: isinstance(v, list) and all(isinstance(e, dict) and all(map(_number, e.values())) for e in v),
        "a list of objects of numbers",
        False,
    ),
}


def probe_report(path: Path) -> tuple[dict, pd.DataFrame]:
    """The saved sweep at ``path`` and its rows as a table; ``BadInput`` naming the file and the
    field when it is not what ``workbench probe`` writes (the page shows that, and keeps working)."""
    report = read_json(path)
    if type(report.get("n_sequences")) is not int or not isinstance(report.get("task"), str):
        raise BadInput(f"{path}: fields 'n_sequences' (a whole number) and 'task' (a string) are required")
    rows = report.get("rows")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise BadInput(f"{path}: field 'rows' must be a non-empty list of objects, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        for name, (check, expected, required) in ROW.items():
            if name not in row and not required:
                continue
            if name not in row or not check(row[name]):
                shown = repr(row.get(name))[:60]
                raise BadInput(f"{path}: field 'rows[{i}].{name}' must be {expected}, got {shown}")
    table = pd.DataFrame(rows).astype({"passes": str})  # 1, 2, ... or "exact"
    return report, table


LAYER0 = "blocks.0.hook_resid_pre"
MEMORISED = 0.99  # control accuracy at which the control task is memorised, not read

st.title("Probes")
st.caption("Does recurrent (K-pass) prefill expose a global state at the bottom of the stack, where standard prefill does not?")
run = pick_run("Run", key="probe_run", default=find(runs(), "fbt"))
if run is None:
    st.stop()
tok = tokenizer(run)
if tok.kind != "char":
    st.caption(
        f"{run.name} reads subword tokens ({tokenizer_summary(tok)}): the task texts are encoded with its tokenizer and "
        "each token takes the label of the character it ends at (a token ending inside a character is not probed)."
    )

own = run_task(run)
targets = sorted(TARGET_TASK)
follow("probe_target", run.name, default_target(own) if own.labels else "memory")
c1, c2, c3 = st.columns(3)
target = c1.selectbox(
    "Target",
    targets,
    key="probe_target",
    format_func=lambda t: f"{t} (the run's task)" if t in own.labels else t,
    help="memory: the flip-flop's stored bit; perm_state: the running product; carry: addition's carry; running_sum: "
    "modsum's running sum; value: chain's current value. Each is probed on held-out problems of its own task.",
)
if target not in own.labels:
    input_warnings([run], task=TARGET_TASK[target])
n_sequences = c2.number_input("Sequences", min_value=10, max_value=20000, value=N_SEQUENCES, step=50, key="probe_n")
n_layers = run.config["model"]["n_layers"]
every_hook = default_hooks(n_layers)
follow("probe_hooks", str(run.path), every_hook)  # every depth of the run chosen now, not the last run's choice
hooks = c3.multiselect("Hooks", every_hook, key="probe_hooks")
passes, exact = [], False
if run.arch == "fbt":
    c4, c5 = st.columns(2)
    passes = c4.multiselect("Recurrent prefill K", [2, 3, 4, 6, 8], default=[2, 3], key="probe_passes")
    exact = c5.checkbox("Also the exact recurrence", value=True, key="probe_exact")

with_capacity = st.checkbox(
    "Capacity measures at every depth (online-code MDL and rank-limited probes)",
    value=False,
    key="probe_capacity",
    help="What a probe's accuracy alone cannot tell: how much structure it needed. They cost more than the probes "
    "themselves (on the quick zoo's fbt at the defaults: 301 s with them, 147 s without); without this box the "
    "online-code MDL is measured at layer 0 only.",
)

saved = run.path / "results" / f"probe_{target}.json"
outputs = [saved, saved.parent / "probes" / target]
previous = saved.exists() or outputs[1].exists()  # a sweep replaces only its own outputs
label = "Retrain probes (replaces the saved ones)" if previous else "Train probes"
busy = jobs.running("probes", saved)
if st.button(label, key="probe_train", type="primary", disabled=bool(busy)):
    if not hooks:
        st.error("Pick at least one hook to probe.")
    else:
        argv = ["probe", str(run.path), "--target", target, "--n", str(int(n_sequences)), "--hooks", *hooks]
        argv += ["--passes", ",".join(map(str, passes))] if passes else []
        argv += [] if exact else ["--no-exact"]
        argv += [] if with_capacity else ["--mdl-hooks", LAYER0, "--ranks", "none"]
        argv += ["--overwrite"] if previous else []
        if jobs.start(argv, title=f"Probe {target} on {run.name}", page="probes", outputs=outputs):
            st.rerun()
jobs.panel("probes")
if busy:
    st.info(f"Probing {target} on {run.name}: the results appear here when the job is done.")
    st.stop()

if not saved.is_file():
    st.info(f"No saved probes for {target} on {run.name}: press **Train probes**.")
    st.stop()

report = None
with shown_errors(f"Reading the saved probes {saved}"):
    report, rows = probe_report(saved)
if report is None:
    st.stop()
rows["regime"] = [p if p == "standard" else f"recurrent K={k}" for p, k in zip(rows["prefill"], rows["passes"])]
if rows["stream"].nunique() > 1:
    rows["regime"] = rows["regime"] + " / stream " + rows["stream"].astype(str)
st.caption(f"Saved results: {saved} ({report['n_sequences']} sequences, task {report['task']}).")

layer0 = rows[rows["layer"] == 0.0]
if len(layer0):
    st.subheader("Layer 0: the input to block 0")
    base = layer0[layer0["prefill"] == "standard"]["accuracy"]
    cols = st.columns(len(layer0))
    for col, (_, r) in zip(cols, layer0.iterrows()):
        change = None if r["prefill"] == "standard" or base.empty else round(r["accuracy"] - base.iloc[0], 3) + 0.0
        compression = r.get("compression")
        described = compression is not None and compression == compression  # NaN: not measured at this hook
        # a change that rounds to 0 is shown as +0.000 without a colour (it read -0.000 in red)
        col.metric(
            r["regime"] + ("" if r["converged"] else " (not converged)"),
            f"{r['accuracy']:.3f}",
            None if change is None else f"{change:+.3f} vs standard",
            delta_color="normal" if change else "off",
            delta_arrow="auto" if change else "off",
            help=f"chance {r['chance']:.3f}, control {r['control_accuracy']:.3f}"
            + (f", MDL compression {compression:.2f} (control {r['control_compression']:.2f})" if described else ""),
        )
        if described:
            col.caption(f"MDL compression {compression:.2f} (control {r['control_compression']:.2f})")
    unconverged = layer0[~layer0["converged"]]["regime"].tolist()
    if unconverged:
        st.warning(
            f"The layer-0 probe of {', '.join(unconverged)} did not converge (its solver stopped at its iteration "
            "limit): that accuracy may understate what a linear probe reads there; compare the converged ones."
        )
    if (layer0["control_accuracy"] >= MEMORISED).any():
        st.info(
            f"The control task (token identity) is solved by memorisation at layer 0 (control accuracy >= {MEMORISED}): "
            "selectivity (probe minus control accuracy) says nothing there. The MDL compression (uniform code / online "
            "code, real labels against control labels) is the measure that does."
        )

st.subheader("Accuracy by depth")
st.altair_chart(probe_depths(rows, run.arch), width="stretch")
covered = sorted(set(rows["hook"]), key=every_hook.index) if set(rows["hook"]) <= set(every_hook) else sorted(set(rows["hook"]))
regimes_covered = ", ".join(dict.fromkeys(rows["regime"]))
st.caption(
    f"These probes cover {len(covered)} of the run's {len(every_hook)} depths ({', '.join(covered)}), prefill "
    f"{regimes_covered}, on {report['n_sequences']} sequences."
)
if len(covered) < len(every_hook):
    st.warning(
        f"The saved probes cover {len(covered)} of the {len(every_hook)} depths of {run.name}: retrain with every hook "
        "to see the whole stack."
    )
st.caption(
    "Grey dashed: chance (majority class). Dashed lines: the control task (token identity labels); "
    "selectivity = probe minus control accuracy. Colours: the prefill regime (recurrent prefill is the fused "
    "regime's), as in every figure of the workbench."
)
capacity = [c for c in ("compression", "control_compression", "mdl_bits", "uniform_bits") if c in rows and rows[c].notna().any()]
if "rank_sweep" in rows and rows["rank_sweep"].map(bool).any():  # the lowest rank's accuracies (probes of limited capacity)
    low = rows["rank_sweep"].map(lambda sweep: sweep[0] if sweep else {})
    rows = rows.assign(
        lowest_rank=low.map(lambda e: e.get("rank")),
        rank_accuracy=low.map(lambda e: e.get("accuracy")),
        rank_control=low.map(lambda e: e.get("control_accuracy")),
    )
    capacity += ["lowest_rank", "rank_accuracy", "rank_control"]
if capacity:
    st.caption(
        "Capacity-controlled measures (the control task above is memorised by full probes): compression = "
        "uniform code / online code (Voita & Titov's MDL; ~1: the labels are not predicted), for the real and the "
        "control labels; the lowest-rank probe's accuracy on the real and the control labels (Hewitt & Liang)."
    )
st.dataframe(
    rows[
        [
            "hook",
            "layer",
            "regime",
            "accuracy",
            "control_accuracy",
            "selectivity",
            *capacity,
            "chance",
            "n_train",
            "n_test",
            "converged",
        ]
    ],
    hide_index=True,
)
