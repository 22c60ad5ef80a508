"""Streams (HD): how the n interleaved embedding streams differ, layer by layer."""

import pandas as pd
import streamlit as st

from app.charts import attention_mass_bars, similarity_heatmap
from app.state import (
    device,
    find,
    follow,
    input_warnings,
    model_at,
    pick_run,
    run_task,
    run_task_at,
    runs,
    shown_errors,
    stamp,
    tokenizer_at,
)
from workbench.data.tasks import SYNTHETIC
from workbench.studies.streams import attention_mass, stream_logit_lens, stream_norms, stream_similarity, task_windows

st.title("Streams (Hidden Decoding)")
st.caption("Each token enters as n streams; only the last is read out. Do the streams specialise, or stay copies?")
run = pick_run(
    "HD run",
    archs=("hd",),
    needs="these analyses compare the n embedding streams of a Hidden Decoding model; baseline runs "
    "(imported pretrained models included) and FBT runs have one stream",
    key="st_run",
    default=find(runs(), "hd4"),
)
if run is None:
    st.stop()
own = run_task(run)
offered = list(dict.fromkeys([own.spec, *SYNTHETIC] if own.spec else SYNTHETIC))
follow("st_task", (run.name, own.spec), offered[0])
c1, c2, c3, c4 = st.columns(4)
task = c1.selectbox(
    "Text",
    offered,
    key="st_task",
    format_func=lambda t: f"{t} (the run's own task, held out)" if t == own.spec else t,
)
if task != own.spec:
    input_warnings([run], task=task)
n_sequences = c2.number_input("Sequences", min_value=1, max_value=256, value=16, key="st_n")
seq_len = c3.number_input("Tokens per sequence", min_value=2, max_value=4096, value=64, key="st_len")
completions = own.loss_on == "completion" and task == own.spec
scored = c4.radio(
    "Logit lens scores",
    ["scored positions", "all positions"] if completions else ["all positions"],
    key="st_scored",
    help="The positions training scored: completions (answers), not the prompts' tokens, which are read, not predicted."
    if completions
    else f"Training scored every position of {own.name}.",
)
n_ctx = run.config["model"]["n_ctx"]
if seq_len > n_ctx:
    st.error(f"Tokens per sequence ({seq_len}) exceeds the model's context n_ctx={n_ctx}.")
    st.stop()


@st.cache_data(show_spinner="Running the model...", max_entries=16)
def analyse(path: str, version: tuple, task: str, n: int, length: int, scored: bool, on: str) -> dict:
    m = model_at(path)  # on the sidebar's device (``on``: part of the cache key)
    own = run_task_at(path)
    x, y = task_windows(
        task,
        n,
        length,
        tokenizer=tokenizer_at(path),
        data=own.settings,  # the run's task settings: its problems
        completion_only=scored,
        example_starts=own.windows == "example",
    )
    x, y = x.to(m.embed.W_E.device), y.to(m.embed.W_E.device)
    return {
        "similarity": stream_similarity(m, x).cpu().numpy(),
        "mass": attention_mass(m, x),
        "lens": stream_logit_lens(m, x, y),
        "norms": stream_norms(m, x).cpu().numpy(),
        "n_streams": m.n_streams,
        "cross_layers": list(m.cfg.cross_layers or []),
    }


a = None
with shown_errors("Stream analysis"):
    a = analyse(str(run.path), stamp(run.path), task, int(n_sequences), int(seq_len), scored == "scored positions", device())
if a is None:
    st.stop()
n = a["n_streams"]
st.caption(f"{n} streams; cross-stream attention in block(s) {a['cross_layers']}, intra-stream elsewhere.")

left, right = st.columns(2)
with left:
    st.markdown("**Stream-to-stream similarity** (mean cosine of resid_post at the same token)")
    follow("st_layer", len(a["similarity"]), len(a["similarity"]) - 1)  # the last block of the run analysed now
    layer = st.slider("Block", 0, len(a["similarity"]) - 1, key="st_layer")
    sim = pd.DataFrame(
        [{"stream": i, "other": j, "cosine": float(a["similarity"][layer][i, j])} for i in range(n) for j in range(n)]
    )
    st.altair_chart(similarity_heatmap(sim), width="stretch")
    st.caption(
        "Colour on the whole cosine range [-1, 1]: near-copies (cosine close to 1) look alike. The exact values are in "
        "the tooltip, and the mean off-diagonal cosine by block below."
    )
    off = [
        {"block": i, "mean off-diagonal cosine": float((s.sum() - s.trace()) / (n * n - n)) if n > 1 else 1.0}
        for i, s in enumerate(a["similarity"])
    ]
    # a short axis title: Vega cuts a rotated title at the plot's height (200 px held 'mean off-diagonal cosin')
    st.markdown("Mean off-diagonal cosine by block")
    st.line_chart(pd.DataFrame(off), x="block", y_label="cosine", height=200)
with right:
    st.markdown("**Attention mass** per block: own stream, other streams of the same token, other streams of earlier tokens")
    mass = pd.DataFrame([{"block": i, "where": k, "mass": v} for i, m in a["mass"].items() for k, v in m.items()])
    st.altair_chart(attention_mass_bars(mass), width="stretch")
    st.markdown("**Per-stream logit lens** (each stream's final state through the readout)")
    st.caption(
        f"Scored on {a['lens']['positions']:,} positions: "
        + ("the completions training scored." if scored == "scored positions" else "every position, prompts included.")
    )
    lens = pd.DataFrame({"stream": range(n), "next-token loss": a["lens"]["loss"], "top-1 accuracy": a["lens"]["accuracy"]})
    st.dataframe(lens, hide_index=True)
    st.bar_chart(lens, x="stream", y="next-token loss", height=200)

st.markdown("**Per-stream activation norms** by depth (0 = stack input)")
norms = pd.DataFrame(a["norms"], columns=[f"stream {i}" for i in range(n)]).rename_axis("depth").reset_index()
st.line_chart(norms, x="depth", height=240)
