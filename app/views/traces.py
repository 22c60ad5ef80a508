"""Trace lengths: the same problems under each model and regime; lengths, accuracy, and one
problem's traces side by side with the carried-state norm under every token."""

import altair as alt
import pandas as pd
import streamlit as st

from app.state import find, model, pick_run, runs, shown_errors, token_strip
from workbench.runtime.tokenizer import load_tokenizer
from workbench.studies.traces import problems, run_traces, summarise

st.title("Trace lengths")
st.caption("How long does each model and regime reason before it answers (tokens before ####), and how often is it right?")
chosen = pick_run(
    "Models (the first one's standard regime is the paired reference)",
    key="tr_runs",
    multiple=True,
    default=find(runs(), "fbt", "baseline"),
)
if not chosen:
    st.stop()
c1, c2, c3, c4 = st.columns(4)
regimes = c1.multiselect(
    "FBT regimes",
    ["standard", "soft", "fused"],
    default=["standard", "soft", "fused"],
    key="tr_regimes",
    help="Other architectures always decode in the standard regime.",
)
passes = c2.number_input("Fused prefill K", min_value=1, max_value=64, value=2, key="tr_passes")
difficulties = c3.multiselect("Difficulties (steps)", [1, 2, 3, 4, 5, 6], default=[1, 2, 3, 4], key="tr_difficulty")
n_problems = c4.number_input("Problems", min_value=1, max_value=2000, value=24, step=8, key="tr_n")
max_new = st.slider("Token budget per trace", 16, 256, 160, key="tr_budget")

if st.button("Compare", key="tr_compare", type="primary"):
    if not regimes or not difficulties:
        st.error("Pick at least one regime and one difficulty.")
    else:
        with st.status("Generating traces", expanded=True) as status, shown_errors("Trace generation"):
            examples = problems("chain", int(n_problems), sorted(difficulties))
            jobs = [(r, g) for r in chosen for g in (regimes if r.arch == "fbt" else ["standard"])]
            bar = st.progress(0.0)
            rows = []
            for i, (run, regime) in enumerate(jobs):
                bar.progress(i / len(jobs), text=f"{run.name} / {regime}")
                tokenizer = load_tokenizer(run.path)
                rows += [
                    {"model": run.name, "regime": regime, **row}
                    for row in run_traces(model(run), examples, regime, int(passes), tokenizer, max_new_tokens=max_new)
                ]
            bar.progress(1.0, text="done")
            reference = (chosen[0].name, "standard")
            st.session_state["traces"] = {
                "rows": rows,
                "summary": summarise(rows, reference),
                "prompts": {i: ex.prompt for i, ex in enumerate(examples)},
            }
            status.update(label=f"{len(rows)} traces on {len(examples)} problems", state="complete")

study = st.session_state.get("traces")
if not study:
    st.info("Press **Compare** to generate traces.")
    st.stop()

rows = pd.DataFrame(study["rows"])
rows["run"] = rows["model"] + "/" + rows["regime"]
shown = st.selectbox("Difficulty shown", ["all"] + sorted(rows["difficulty"].unique().tolist()), key="tr_show")
view = rows if shown == "all" else rows[rows["difficulty"] == shown]

table = (
    view.groupby("run")
    .agg(
        problems=("problem_id", "size"),
        mean_trace=("trace_tokens", "mean"),
        median_trace=("trace_tokens", "median"),
        accuracy=("correct", "mean"),
        unfinished=("finished", lambda s: 1 - s.mean()),
    )
    .reset_index()
)
st.dataframe(table, hide_index=True)
paired = study["summary"]["paired"]
if paired:
    st.caption(f"Paired against {study['summary']['reference']} (all difficulties, 95% bootstrap intervals):")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "comparison": k,
                    "Δ trace tokens": v["trace_tokens"]["mean"],
                    "CI": f"[{v['trace_tokens']['ci_low']:+.1f}, {v['trace_tokens']['ci_high']:+.1f}]",
                    "Δ accuracy": v["accuracy"]["mean"],
                }
                for k, v in paired.items()
            ]
        ),
        hide_index=True,
    )

left, right = st.columns(2)
with left:
    st.markdown("**Trace length histogram**")
    st.altair_chart(
        alt.Chart(view)
        .mark_bar(opacity=0.6)
        .encode(
            x=alt.X("trace_tokens:Q", bin=alt.Bin(maxbins=30), title="tokens before ####"),
            y=alt.Y("count():Q", stack=None),
            color="run:N",
        ),
        width="stretch",
    )
with right:
    st.markdown("**Accuracy vs mean trace length** (one point per difficulty)")
    by_d = (
        rows.groupby(["run", "difficulty"]).agg(mean_trace=("trace_tokens", "mean"), accuracy=("correct", "mean")).reset_index()
    )
    st.altair_chart(
        alt.Chart(by_d)
        .mark_line(point=True)
        .encode(
            x=alt.X("mean_trace:Q", title="mean trace tokens"),
            y=alt.Y("accuracy:Q", scale=alt.Scale(domain=[0, 1])),
            color="run:N",
            tooltip=["run", "difficulty", "mean_trace", "accuracy"],
        ),
        width="stretch",
    )

st.subheader("One problem under each model and regime")
pid = st.selectbox(
    "Problem",
    sorted(view["problem_id"].unique().tolist()),
    key="tr_problem",
    format_func=lambda i: f"#{i} (difficulty {int(rows[rows['problem_id'] == i]['difficulty'].iloc[0])})",
)
st.code(study["prompts"][pid], language=None)
for _, r in rows[rows["problem_id"] == pid].iterrows():
    verdict = ":green[correct]" if r["correct"] else ":red[wrong]"
    st.markdown(f"**{r['run']}**: {verdict}, answer {r['answer']}, {r['trace_tokens']} trace tokens")
    tokens = list(r["text"]) + (["<eos>"] if r["finished"] else [])
    norms = r["state_norms"] if isinstance(r["state_norms"], list) else []
    st.html(token_strip(tokens, {"||h||": norms[: len(tokens)]} if norms else {}, shade="||h||" if norms else None))
