"""Playground: one prompt under each regime, per-token state norms and gates, and interventions.
The prompt is encoded, and every generated token decoded, with the run's own tokenizer (subwords for
an imported model, whose prompt can also go through its chat template)."""

import streamlit as st

from app.charts import intervention_label, state_norms
from app.state import (
    default_prompt,
    find,
    follow,
    input_warnings,
    model,
    pick_run,
    runs,
    show_text,
    shown_errors,
    token_strip,
    tokenizer,
    tokenizer_summary,
)
from workbench.studies.playground import FED_BACK, Intervention, inspect_generation

st.title("Playground")
run = pick_run("Run", key="pg_run", default=find(runs(), "fbt"))
if run is None:
    st.stop()
tok = tokenizer(run)
st.caption(f"Tokenizer: {tokenizer_summary(tok)}. Each box below is one generated token.")
own = default_prompt(run)
follow("pg_prompt", (run.name, own), own or "")
prompt = st.text_area(
    "Prompt",
    key="pg_prompt",
    height=80,
    help="By default the first held-out problem of the run's own task"
    + ("" if own is not None else " (this run records none: an imported model; type any text)")
    + ".",
)
if prompt and prompt != own:
    input_warnings([run], prompt=prompt)
chat = bool(tok.chat_template) and st.checkbox(
    "Chat format",
    value=False,
    key="pg_chat",
    help="Send the prompt as a user's turn through the tokenizer's chat template, with the assistant's turn opened "
    "(what an instruct model was trained to continue).",
)
c1, c2, c3 = st.columns(3)
is_fbt, is_hd = run.arch == "fbt", run.arch == "hd"
offered = ["standard", "soft", "fused"] if is_fbt else ["standard"]
follow("pg_regimes", tuple(offered), offered)  # what the chosen run decodes in, not the last run's choice
regimes = c1.multiselect("Regimes", offered, key="pg_regimes")
passes = c2.number_input("Fused prefill K", min_value=1, max_value=64, value=2, key="pg_passes", disabled=not is_fbt)
max_new = c3.slider("New tokens", 1, 200, 64, key="pg_new")

intervention = Intervention()
if is_fbt and any(r in FED_BACK for r in regimes):  # standard carries no state to intervene on
    how = st.radio(
        "Intervention on the carried state (soft and fused)",
        ["none", "zero", "scale"],
        horizontal=True,
        key="pg_intervene",
        help="Multiplies h_{t-1} where it enters the fusion, at every fed-back step. The standard regime feeds no "
        "state back: it runs once, without the intervention.",
    )
    if how != "none":
        scale = 0.0 if how == "zero" else st.slider("Scale", -2.0, 4.0, 0.5, 0.1, key="pg_scale")
        intervention = Intervention(state_scale=scale)
elif is_hd:
    n = run.config["model"]["n_streams"]
    follow("pg_ablate", n, "none")
    stream = st.selectbox("Ablate a stream (zero its embedding)", ["none", *range(n)], key="pg_ablate")
    if stream != "none":
        intervention = Intervention(ablate_stream=int(stream))
compare = st.checkbox(
    "Also show the run without the intervention", value=True, key="pg_compare", disabled=intervention == Intervention()
)
stop_at_eos = st.checkbox(
    "Stop at <eos>", value=True, key="pg_eos", help="Off: generate the whole budget, to see what the model does past its end."
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
                # where the intervention would change nothing (no carried state), the regime runs once, plainly
                for v in variants if intervention.changes(regime) else [Intervention()]:
                    outs.append(
                        inspect_generation(
                            model(run),
                            sent,
                            regime=regime,
                            passes=int(passes),
                            max_new_tokens=max_new,
                            intervention=v,
                            tokenizer=tok,
                            stop_at_eos=stop_at_eos,
                        )
                    )
        st.session_state["playground"] = outs
        st.session_state["playground_arch"] = run.arch  # what the outputs were generated on, whatever is picked since

if st.session_state.get("playground") and st.session_state["playground"][0]["prompt"] != prompt:
    with st.expander("Prompt sent to the model"):  # chat formatted (or edited since)
        show_text(st.session_state["playground"][0]["prompt"])
for out in st.session_state.get("playground", []):
    label = intervention_label(out["intervention"])
    label = f" — {label}" if label else ""
    st.markdown(f"**{out['regime']}**{label}" + ("" if out["finished"] else " (budget ran out before <eos>)"))
    rows = {"||h||": out["state_norm"]}
    if any(g is not None for g in out["gate_mean"]):
        rows |= {"gate sd": out.get("gate_sd", []), "||W_U h||": out["value_norm"]}
    st.html(token_strip(out["tokens"], rows, shade="||h||"))
    show_text(out["text"])
if any(g is not None for out in st.session_state.get("playground", []) for g in out["gate_mean"]):
    st.caption(
        "gate sd: the spread over d_model of the gate sigmoid(W_G e) each fed-back token re-entered with (its mean sits "
        "near 0.5 whatever passes); ||W_U h||: the norm of the value path, the carried state's contribution."
    )
if st.session_state.get("playground"):
    arch = st.session_state.get("playground_arch", run.arch)
    st.altair_chart(state_norms(st.session_state["playground"], arch), width="stretch")
