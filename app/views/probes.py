"""Probes: linear probes by depth and prefill regime; the layer-0 comparison first."""

import pandas as pd
import streamlit as st

from app import jobs
from app.charts import probe_depths
from app.state import find, pick_run, runs, tokenizer, tokenizer_summary
from workbench.data.tasks import LABELS
from workbench.probing.study import N_SEQUENCES, default_hooks
from workbench.storage.files import read_json

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

targets = sorted(label for labels in LABELS.values() for label in labels)
c1, c2, c3 = st.columns(3)
target = c1.selectbox(
    "Target",
    targets,
    index=targets.index("memory"),
    key="probe_target",
    help="memory: the flip-flop's stored bit; running_sum: modsum's running sum; value: chain's current value",
)
n_sequences = c2.number_input("Sequences", min_value=10, max_value=20000, value=N_SEQUENCES, step=50, key="probe_n")
n_layers = run.config["model"]["n_layers"]
hooks = c3.multiselect("Hooks", default_hooks(n_layers), default=default_hooks(n_layers), key="probe_hooks")
passes, exact = [], False
if run.arch == "fbt":
    c4, c5 = st.columns(2)
    passes = c4.multiselect("Recurrent prefill K", [2, 3, 4, 6, 8], default=[2, 3], key="probe_passes")
    exact = c5.checkbox("Also the exact recurrence", value=True, key="probe_exact")

with_capacity = st.checkbox(
    "Capacity measures (online-code MDL and rank-limited probes)",
    value=False,
    key="probe_capacity",
    help="What a probe's accuracy alone cannot tell: how much structure it needed. They cost more than the probes "
    "themselves (on the quick zoo's fbt at the defaults: 301 s with them, 147 s without).",
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
        argv += [] if with_capacity else ["--no-mdl", "--ranks", "none"]
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

report = read_json(saved)
rows = pd.DataFrame(report["rows"]).astype({"passes": str})  # 1, 2, ... or "exact"
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
        delta = None if r["prefill"] == "standard" or base.empty else f"{r['accuracy'] - base.iloc[0]:+.3f} vs standard"
        col.metric(
            r["regime"], f"{r['accuracy']:.3f}", delta, help=f"chance {r['chance']:.3f}, control {r['control_accuracy']:.3f}"
        )

st.subheader("Accuracy by depth")
st.altair_chart(probe_depths(rows, run.arch), width="stretch")
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
