"""Playground: one prompt under each regime, per-token state norms and gates, and interventions.
The prompt is encoded, and every generated token decoded, with the run's own tokenizer (subwords for
an imported model, whose prompt can also go through its chat template)."""

import pandas as pd
import streamlit as st

from app.state import find, model, pick_run, runs, show_text, shown_errors, token_strip, tokenizer, tokenizer_summary
from workbench.dynamics.study import DEFAULT_PROMPT
from workbench.studies.playground import Intervention, inspect_generation

st.title("Playground")
run = pick_run("Run", key="pg_run", default=find(runs(), "fbt"))
if run is None:
    st.stop()
tok = tokenizer(run)
st.caption(f"Tokenizer: {tokenizer_summary(tok)}. Each box below is one generated token.")
prompt = st.text_area("Prompt", DEFAULT_PROMPT, key="pg_prompt", height=80)
chat = bool(tok.chat_template) and st.checkbox(
    "Chat format",
    value=False,
    key="pg_chat",
    help="Send the prompt as a user's turn through the tokenizer's chat template, with the assistant's turn opened "
    "(what an instruct model was trained to continue).",
)
c1, c2, c3 = st.columns(3)
is_fbt, is_hd = run.arch == "fbt", run.arch == "hd"
regimes = c1.multiselect(
    "Regimes",
    ["standard", "soft", "fused"] if is_fbt else ["standard"],
    default=["standard", "soft", "fused"] if is_fbt else ["standard"],
    key="pg_regimes",
)
passes = c2.number_input("Fused prefill K", min_value=1, max_value=64, value=2, key="pg_passes", disabled=not is_fbt)
max_new = c3.slider("New tokens", 1, 200, 64, key="pg_new")

intervention = Intervention()
if is_fbt:
    how = st.radio(
        "Intervention on the carried state",
        ["none", "zero", "scale"],
        horizontal=True,
        key="pg_intervene",
        help="Multiplies h_{t-1} where it enters the fusion, at every fed-back step (soft and fused regimes).",
    )
    if how != "none":
        scale = 0.0 if how == "zero" else st.slider("Scale", -2.0, 4.0, 0.5, 0.1, key="pg_scale")
        intervention = Intervention(state_scale=scale)
elif is_hd:
    n = run.config["model"]["n_streams"]
    stream = st.selectbox("Ablate a stream (zero its embedding)", ["none", *range(n)], key="pg_ablate")
    if stream != "none":
        intervention = Intervention(ablate_stream=int(stream))
compare = st.checkbox(
    "Also show the run without the intervention", value=True, key="pg_compare", disabled=intervention == Intervention()
)

if st.button("Generate", key="pg_generate", type="primary"):
    if not regimes:
        st.error("Pick at least one regime.")
    else:
        outs = []
        with shown_errors("Generation"):
            sent = tok.chat_prompt(prompt, f"{run.name}'s tokenizer") if chat and prompt else prompt
            variants = [intervention] + ([Intervention()] if compare and intervention != Intervention() else [])
            for regime in regimes:
                for v in variants:
                    outs.append(
                        inspect_generation(
                            model(run),
                            sent,
                            regime=regime,
                            passes=int(passes),
                            max_new_tokens=max_new,
                            intervention=v,
                            tokenizer=tok,
                        )
                    )
        st.session_state["playground"] = outs

if st.session_state.get("playground") and st.session_state["playground"][0]["prompt"] != prompt:
    with st.expander("Prompt sent to the model"):  # chat formatted (or edited since)
        show_text(st.session_state["playground"][0]["prompt"])
for out in st.session_state.get("playground", []):
    iv = out["intervention"]
    label = (
        ""
        if iv == {"state_scale": 1.0, "ablate_stream": None}
        else (f" — state × {iv['state_scale']}" if iv["ablate_stream"] is None else f" — stream {iv['ablate_stream']} ablated")
    )
    st.markdown(f"**{out['regime']}**{label}" + ("" if out["finished"] else " (budget ran out before <eos>)"))
    rows = {"||h||": out["state_norm"]}
    if any(g is not None for g in out["gate_mean"]):
        rows |= {"gate": out["gate_mean"], "||W_U h||": out["value_norm"]}
    st.html(token_strip(out["tokens"], rows, shade="||h||"))
    show_text(out["text"])
if st.session_state.get("playground"):
    curves = pd.DataFrame(
        {
            f"{o['regime']}{'' if o['intervention']['state_scale'] == 1.0 and o['intervention']['ablate_stream'] is None else ' (intervened)'}": pd.Series(
                o["state_norm"]
            )
            for o in st.session_state["playground"]
        }
    )
    st.markdown("**Carried-state norm per generated token**")
    st.line_chart(curves, height=220)
