"""Runs: what is under the runs directory, training curves, eval tables, each model's size,
tokenizer and (for an imported model) source; trains a zoo when empty."""

from pathlib import Path

import pandas as pd
import streamlit as st

from app import jobs
from app.charts import stage_losses
from app.state import model, runs, runs_root, shown_errors, tokenizer_at, tokenizer_summary
from workbench.training.zoo import ORGANISMS, ORGANISMS_FILE, member_names

st.title("Runs")
root = runs_root()
found = runs()


# what the panel offers: the micro and quick zoos, the three organisms at one seed, the earlier cpu zoo
ZOOS = {
    "micro": "~15 s on 2 cores: a plumbing check that exercises every page and learns nothing",
    "quick": "~2.5 min: the flip-flop organism, learned (held-out accuracy 1.0 at 5 of 5 seeds)",
    "organisms": "~11 min: the three model organisms (flip-flop, permutations, addition) at one seed (docs/organisms.md)",
    "cpu": "~30 min (estimated): the earlier reference zoo, which learns part of its tasks (docs/organisms.md)",
}


def train_zoo_panel() -> None:
    scale = st.radio("Zoo", list(ZOOS), horizontal=True, key="zoo_scale", captions=list(ZOOS.values()))
    out = root / scale
    if scale == "organisms":
        names = [f"{task}/{n}" for task, preset in ORGANISMS.items() for n in member_names(preset)]
        outputs = [out, out / ORGANISMS_FILE, *(out / task for task in ORGANISMS), *(out / n for n in names)]
    else:
        outputs = [out, out / "zoo.json", *(out / n for n in member_names(scale))]
    busy = jobs.running("runs", out)
    if st.button(f"Train the {scale} zoo into {out}", key="train_zoo", type="primary", disabled=bool(busy)):
        if jobs.start(
            ["zoo", "--preset", scale, "--out", str(out)], title=f"Train the {scale} zoo", page="runs", outputs=outputs
        ):
            st.rerun()


jobs.panel("runs")
if not found:
    st.info(f"No runs under {root}. Train the reference zoo (baseline, fbt, hd2, hd4) here:")
    train_zoo_panel()
    st.stop()

for r in found:
    if r.training is not None:  # its directory is held: a job above, or a CLI run elsewhere
        step, steps = r.training["step"], r.training["steps"]
        at = f"step {step} of {steps}" if step is not None and steps else "starting"
        by = r.training["holder"].get("command")
        st.info(f"{r.name}: training ({at}{', by ' + by if by else ''}); usable once it has written its weights.")
    elif r.error is not None:
        st.error(f"{r.name}: cannot be used: {r.error}")


def final_loss(r):
    """The last logged plain next-token loss (FBT logs the weighted sum over passes as ``loss``)."""
    return r.metrics[-1].get("loss_pass1", r.metrics[-1].get("loss")) if r.metrics else None


def source_of(r) -> dict | None:
    """The source record of an imported model (``workbench import`` writes it into config.json)."""
    source = r.config.get("source")
    return source if isinstance(source, dict) else None


def origin(r) -> str | None:
    """Where a run's weights come from: trained here, or imported from a model directory (or GGUF file)."""
    if not r.config:  # unreadable: the error says why
        return None
    source = source_of(r)
    return f"imported: {source.get('gguf_file') or Path(str(source.get('path'))).name}" if source else "trained"


def eval_cell(r, task: str):
    acc = ((r.eval or {}).get("tasks", {}).get(task) or {}).get("accuracy", {})
    return acc.get("standard")


# a column for each task some run was evaluated on, and no other
evaluated = sorted({t for r in found if isinstance((r.eval or {}).get("tasks"), dict) for t in r.eval["tasks"]})


table = pd.DataFrame(
    [
        {
            "run": r.name,
            "arch": r.arch,
            "origin": origin(r),
            "preset": r.config.get("preset"),
            "task": r.config.get("data", {}).get("task"),
            "steps": r.steps,
            "final train loss (pass 1)": final_loss(r),
            **{f"{t} acc (standard)": eval_cell(r, t) for t in evaluated},
            "status": "training" if r.training is not None else "ok" if r.usable else "broken",
            "plumbing check": r.plumbing_check,
        }
        for r in found
    ]
)
st.dataframe(table, hide_index=True)
if table["plumbing check"].any():
    st.caption("Plumbing check: a member of a micro zoo, trained for seconds; its numbers say nothing about the effects studied.")

names = [r.name for r in found]
run = {r.name: r for r in found}[st.selectbox("Run", names, key="run")]
source = source_of(run)
curves, about, evaluation, config, files = st.tabs(["Training curves", "Model", "Eval", "Config", "Results files"])

with curves:
    if not run.metrics and source:
        st.info(
            f"{run.name} was imported (`workbench import`), not trained here: no training curves. The Model tab shows its source."
        )
    elif not run.metrics:
        st.info("No metrics.jsonl lines yet.")
    else:
        df = pd.DataFrame(run.metrics)
        if run.arch == "fbt":
            cols = sorted(c for c in df.columns if c.startswith("loss_pass"))
            st.caption("Loss per pass: pass 1 is the plain model; passes 2 (and 3) train the feedback.")
            st.line_chart(df, x="step", y=cols, y_label="loss")
        elif run.arch == "hd" and "n_streams" in df:
            wide = df.pivot_table(index="step", columns="n_streams", values="loss")
            wide.columns = [f"loss (n={int(n)} streams)" for n in wide.columns]
            st.caption("Loss per expansion stage.")
            st.altair_chart(stage_losses(wide), width="stretch")  # a stage logged once is a point
        else:
            st.line_chart(df, x="step", y="loss", y_label="loss")
        loss_on = run.config.get("data", {}).get("loss_on", "all")
        st.caption(
            "The loss is on the positions training scored: "
            + (
                "the completions (data.loss_on=completion); a prompt's tokens are read, not predicted."
                if loss_on == "completion"
                else "every position (data.loss_on=all)."
            )
        )
        left, right = st.columns(2)
        left.line_chart(df, x="step", y="lr", height=200)
        right.line_chart(df, x="step", y="tokens_per_s", height=200)

with about:
    if run.training is not None:
        st.info(f"{run.name} is training: its model is shown once it has written its weights.")
    elif not run.usable:
        st.info(f"{run.name} cannot be used: {run.error}")
    else:
        shape = run.config["model"]
        with shown_errors(f"Loading {run.name}"):
            n_params = sum(p.numel() for p in model(run).parameters())
            left, mid, right = st.columns(3)
            left.metric("Parameters", f"{n_params / 1e6:.1f}M" if n_params >= 1e6 else f"{n_params:,}")
            mid.metric("Layers x d_model", f"{shape['n_layers']} x {shape['d_model']}")
            right.metric("Context (n_ctx)", f"{shape['n_ctx']:,}")
        tok = None
        with shown_errors(f"Reading the tokenizer of {run.name}"):
            tok = tokenizer_at(run.path)
            st.markdown(f"**Tokenizer**: {tokenizer_summary(tok)} (the model's d_vocab is {shape['d_vocab']:,}).")
        if source:
            st.markdown(
                f"**Imported from** `{source.get('path')}`"
                + (f", GGUF file `{source['gguf_file']}`" if source.get("gguf_file") else "")
            )
            if source.get("sha256"):
                st.caption(f"sha256 {source['sha256']}")
        if tok is not None and tok.chat_template:
            with st.expander("Chat template"):
                st.code(tok.chat_template, language="jinja2")

with evaluation:
    if not run.eval:
        st.info("No results/eval.json: run `workbench eval` on this run.")
    else:
        rows = []
        for task, res in run.eval["tasks"].items():
            for regime, acc in res["accuracy"].items():
                rows.append(
                    {
                        "task": task,
                        "regime": regime,
                        "accuracy": acc,
                        "answer loss": res["answer_loss"].get(regime),
                        "n": res["n"],
                    }
                )
        st.dataframe(pd.DataFrame(rows), hide_index=True)
        st.caption(f"Fused regime prefill K = {run.eval.get('fused_passes')}; answer loss is the completion's mean NLL.")

with config:
    st.json(run.config, expanded=1)

with files:
    st.write(run.results or "no results yet")

with st.expander("Train another zoo"):
    train_zoo_panel()
