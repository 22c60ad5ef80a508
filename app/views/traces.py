"""Trace lengths: the same problems under each model and regime; lengths, accuracy, and one
problem's traces side by side with the carried-state norm under every token. Each run encodes with
its own tokenizer (an instruct model's prompt can go through its chat template); runs with different
tokenizers are compared in characters, since their token counts do not compare."""

import pandas as pd
import streamlit as st

from app import jobs
from app.charts import accuracy_by_length, trace_histogram
from app.state import (
    find,
    follow,
    input_warnings,
    pick_run,
    pieces,
    run_task,
    runs,
    show_text,
    shown_errors,
    token_strip,
    tokenizer,
    tokenizer_summary,
)
from workbench.storage.errors import BadInput
from workbench.studies.traces import CHAT_INSTRUCTION, chat_problem, default_difficulties, read_study, study_problems

UNITS = {"tokens": "trace_tokens", "characters": "trace_chars"}

st.title("Trace lengths")
st.caption(
    "How long does each model and regime reason before it answers (what it writes before ####), and how often is it right?"
)
chosen = pick_run(
    "Models (the first one's standard regime is the paired reference)",
    key="tr_runs",
    multiple=True,
    default=find(runs(), "fbt", "baseline"),
)
if not chosen:
    st.stop()
tokenizers = {run.name: tokenizer(run) for run in chosen}
templated = [name for name, tok in tokenizers.items() if tok.chat_template]
own = run_task(chosen[0])
try:
    own_trace = own.trace_task()
except BadInput as err:
    if own.kinds:  # answered by one token: nothing to measure, whatever other problems are offered
        st.info(f"{chosen[0].name}: {err}.")
        st.stop()
    own_trace = None
offered = list(dict.fromkeys([*([own_trace] if own_trace else []), "chain", "addition"]))
follow("tr_task", (chosen[0].name, own_trace), offered[0])
task = st.selectbox(
    "Task",
    offered,
    key="tr_task",
    format_func=lambda t: f"{t} (the run's own task, held out)" if t == own_trace else t,
    help=f"Held-out problems of the first run's own task ({own.name}) by default.",
)
if task != own_trace:
    input_warnings(chosen, task=task)
settings_of_task = own.settings if task in own.kinds else None
graded = default_difficulties(task, settings_of_task)
c1, c2, c3, c4 = st.columns(4)
regimes = c1.multiselect(
    "FBT regimes",
    ["standard", "soft", "fused"],
    default=["standard", "soft", "fused"],
    key="tr_regimes",
    help="Other architectures always decode in the standard regime.",
)
passes = c2.number_input("Fused prefill K", min_value=1, max_value=64, value=2, key="tr_passes")
if graded is None:
    difficulties = []
    c3.caption("Difficulties: every problem of the file or corpus")
else:
    follow("tr_difficulty", (task, tuple(graded)), graded)
    difficulties = c3.multiselect(
        f"Difficulties ({'steps' if task == 'chain' else 'digits'})",
        list(range(1, max(graded) + 4)),
        key="tr_difficulty",
        help="The run's training range by default; larger ones test beyond it.",
    )
n_problems = c4.number_input("Problems", min_value=1, max_value=2000, value=24, step=8, key="tr_n")
max_new = st.slider(
    "Token budget per trace", 16, 256, 160, key="tr_budget", help="In each run's own tokens (a subword holds several characters)."
)
chat = bool(templated) and st.checkbox(
    "Chat format",
    value=False,
    key="tr_chat",
    help=f"Prompt {', '.join(templated)} through the chat template: the question and the instruction "
    f"{CHAT_INSTRUCTION!r} as a user's turn."
    + (
        f" {', '.join(n for n in tokenizers if n not in templated)} (no chat template) keep the completion format."
        if len(templated) < len(tokenizers)
        else ""
    ),
)

# the comparison runs as a background job (the CLI's ``traces``) into a directory named by its
# inputs (the runs' weights included): the same inputs show the saved comparison at once
by_name = {run.name: run for run in chosen}  # paths under the runs root: micro/fbt and quick/fbt compare
as_chat = [run.name for run in chosen if chat and run.name in templated]
settings = {
    "--task": task,
    "--regimes": ",".join(regimes),
    "--passes": int(passes),
    "--n": int(n_problems),
    **({"--difficulty": ",".join(map(str, sorted(difficulties)))} if graded is not None else {}),
    "--max-new-tokens": int(max_new),
    **({"--chat": ",".join(as_chat)} if as_chat else {}),
}
out = jobs.keyed_output("traces", chosen, settings)
jobs.panel("traces")
if not (out / "summary.json").is_file():
    if jobs.running("traces", out):
        st.info(f"Generating traces of {', '.join(by_name)}: the comparison appears here when the job is done.")
    elif st.button("Compare", key="tr_compare", type="primary"):
        if not regimes or (graded is not None and not difficulties):
            st.error("Pick at least one regime and one difficulty.")
        else:
            argv = ["traces", *(str(r.path) for r in chosen), "--out", str(out), "--names", *by_name]
            argv += [str(part) for option, value in settings.items() for part in (option, value)]
            if jobs.start(argv, title=f"Traces of {', '.join(by_name)}", page="traces", outputs=[out]):
                st.rerun()
    else:
        st.info("Press **Compare** to generate traces. Saved comparisons of the same inputs show at once.")
    st.stop()

summary = study = None
with shown_errors("Reading the comparison"):
    summary, saved = read_study(out, list(by_name))
    examples = study_problems(summary, tokenizers[chosen[0].name])
    study = pd.DataFrame(saved)
    st.caption(f"Saved comparison: {out}")
if summary is None or study is None:
    st.stop()
for record in (summary.get("inputs") or {}).values():
    if "warning" in record:
        st.warning(record["warning"], icon=":material/warning:")
chat_runs = set((summary["chat"] or {}).get("runs", []))
mixed = len({tok.tokenizer.to_str() for tok in tokenizers.values()}) > 1
if st.session_state.get("tr_shown") != str(out):  # a new comparison: its unit by default
    st.session_state["tr_shown"] = str(out)
    st.session_state["tr_unit"] = "characters" if mixed else "tokens"
rows = study
rows["run"] = rows["model"] + "/" + rows["regime"]
if mixed:
    st.info(
        "The runs use different tokenizers ("
        + "; ".join(f"{name}: {tokenizer_summary(tok)}" for name, tok in tokenizers.items())
        + "): their token counts do not compare, so trace lengths are shown in characters."
    )
c1, c2 = st.columns(2)
offered = ["all"] + sorted(rows["difficulty"].unique().tolist())
follow("tr_show", tuple(offered), "all")  # the difficulties of the traces drawn now
shown = c1.selectbox("Difficulty shown", offered, key="tr_show")
unit = c2.radio(
    "Trace length in",
    list(UNITS),
    horizontal=True,
    key="tr_unit",
    help="Tokens of each run's own tokenizer, or characters: the unit that compares runs whose tokenizers differ.",
)
length = UNITS[unit]
view = rows if shown == "all" else rows[rows["difficulty"] == shown]

table = (
    view.groupby("run")
    .agg(
        problems=("problem_id", "size"),
        prompt=("format", "first"),
        mean_trace=(length, "mean"),
        median_trace=(length, "median"),
        accuracy=("correct", "mean"),
        unfinished=("finished", lambda s: 1 - s.mean()),
    )
    .reset_index()
    .rename(columns={"mean_trace": f"mean trace ({unit})", "median_trace": f"median trace ({unit})"})
)
st.dataframe(table, hide_index=True)
paired = summary["paired"]
if paired:
    st.caption(f"Paired against {summary['reference']} (all difficulties, 95% bootstrap intervals):")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "comparison": k,
                    f"Δ trace {unit}": v[length]["mean"],
                    "CI": f"[{v[length]['ci_low']:+.1f}, {v[length]['ci_high']:+.1f}]",
                    "Δ accuracy": v["accuracy"]["mean"],
                }
                for k, v in paired.items()
            ]
        ),
        hide_index=True,
    )

archs = {run.name: run.arch for run in runs()}  # the study's runs, also when another choice is made since
left, right = st.columns(2)
with left:
    st.markdown("**Trace length histogram**, one panel per model")
    st.altair_chart(trace_histogram(view, length, unit, archs), width="stretch")
with right:
    st.markdown("**Accuracy vs mean trace length** (one point per difficulty)")
    by_d = rows.groupby(["model", "regime", "run", "difficulty"]).agg(mean_trace=(length, "mean"), accuracy=("correct", "mean"))
    st.altair_chart(accuracy_by_length(by_d.reset_index(), unit, archs), width="stretch")

st.subheader("One problem under each model and regime")
problem_ids = sorted(view["problem_id"].unique().tolist())
follow("tr_problem", tuple(problem_ids), problem_ids[0])
pid = st.selectbox(
    "Problem",
    problem_ids,
    key="tr_problem",
    format_func=lambda i: f"#{i} (difficulty {int(rows[rows['problem_id'] == i]['difficulty'].iloc[0])})",
)
st.code(examples[pid].prompt, language=None)
for name in sorted(chat_runs):
    with st.expander(f"Prompt sent to {name} (chat format)"):
        show_text(chat_problem(examples[pid], tokenizers[name]))
for _, r in rows[rows["problem_id"] == pid].iterrows():
    verdict = ":green[correct]" if r["correct"] else ":red[wrong]"
    answer = f"answer {r['answer']}" if isinstance(r["answer"], str) and r["answer"] else "no answer"
    answer += "" if r["finished"] else " (ran out of its token budget before <eos>)"
    st.markdown(
        f"**{r['run']}**: {verdict}, {answer}, {r['trace_tokens']} trace tokens "
        f"({r['trace_chars']} characters)" + (", chat format" if r["format"] == "chat" else "")
    )
    tok = tokenizers[r["model"]]
    tokens = pieces(tok, r["text"]) + ([tok.decode([tok.eos_id], skip_special=False)] if r["finished"] else [])
    norms = r["state_norms"] if isinstance(r["state_norms"], list) else []
    st.html(token_strip(tokens, {"||h||": norms[: len(tokens)]} if norms else {}, shade="||h||" if norms else None))
