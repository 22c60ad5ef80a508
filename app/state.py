"""What every page shares: the runs directory, cached loaders, error display, and small
drawing helpers. Pages import from here; computation lives in ``workbench``."""

from __future__ import annotations

import contextlib
import html
import os
from pathlib import Path
from typing import Literal, overload

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

from workbench.runs import RunInfo, exposure_warning, find_run_dirs, list_runs, within_root
from workbench.runtime.checkpoint import load_model
from workbench.runtime.tokenizer import TokenizerBase, tokenizer_of
from workbench.storage.outputs import holder
from workbench.training.run import Run, RunTask

ROOT_KEY, INPUT_KEY, REFUSED_KEY = "runs_root", "runs_root_input", "runs_root_refused"
DEVICE_KEY = "device"
DEVICES = ("cpu", "cuda")  # the sidebar's choices; cpu is the CLI's default
RUN_FILES = ("config.json", "model.safetensors", "metrics.jsonl", "results/eval.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")  # config.json: d_vocab is checked against it


def app_root() -> Path:
    """The runs root: ``WORKBENCH_RUNS`` (set by ``workbench app --runs``), else ``runs``. The app
    reads and writes only under it."""
    return Path(os.environ.get("WORKBENCH_RUNS") or "runs").resolve()


def runs_root() -> Path:
    """The runs directory: the sidebar's choice (the root or a directory under it), else the root."""
    return Path(st.session_state.get(ROOT_KEY) or app_root())


def _choose_root() -> None:
    """The sidebar box's callback: take the root or a directory under it; refuse anything else
    and put the previous value back in the box."""
    try:
        st.session_state[ROOT_KEY] = str(within_root(st.session_state[INPUT_KEY], app_root()))
    except ValueError as err:
        st.session_state[REFUSED_KEY] = f"Refused: {err}"
    st.session_state[INPUT_KEY] = str(runs_root())


def runs_root_picker() -> None:
    st.session_state.setdefault(INPUT_KEY, str(runs_root()))
    with st.sidebar:
        st.text_input(
            "Runs directory",
            key=INPUT_KEY,
            on_change=_choose_root,
            help=f"{app_root()} (the runs root) or a directory under it; its subdirectories (up to 5 levels deep) are run directories.",
        )
        if refused := st.session_state.pop(REFUSED_KEY, None):
            st.error(refused)
        if not os.path.isdir(runs_root()):
            st.warning(f"{runs_root()} is not a directory yet: the Runs page can train a zoo into it.")
        if warning := exposure_warning(st.get_option("server.address"), app_root()):
            st.warning(warning)


def writable(*paths: Path) -> bool:
    """Whether every path lies under the runs root once symlinks are resolved; if not, an error
    element names the first that does not. Every write the app starts checks this first."""
    try:
        for path in paths:
            within_root(path, app_root())
    except ValueError as err:
        st.error(f"Refused to write: {err}")
        return False
    return True


def _mark(path: Path) -> tuple[int, int] | int:
    try:
        info = path.stat()
    except FileNotFoundError:
        return 0
    except OSError:  # unreadable (EACCES): a chmod that fixes it changes the mark
        return -1
    return info.st_mtime_ns, info.st_ctime_ns  # ctime: a chmod alone changes what can be read


def stamp(path: Path, names: tuple[str, ...] = RUN_FILES) -> tuple:
    """Changes whenever a run's weights, config, metrics or eval (or their modes) change (cache
    invalidation); never raises."""
    return tuple(_mark(path / n) for n in names)


@st.cache_data(show_spinner="Reading runs...", max_entries=16)
def _runs(root: str, stamps: tuple) -> list[RunInfo]:
    return list_runs(root)


def runs() -> list[RunInfo]:
    """Every run under the runs directory, broken ones included (their ``error`` says why)."""
    root = runs_root()
    if not os.path.isdir(root):
        return []
    dirs = find_run_dirs(root)  # the directories themselves and results/ too: modes and the results listing
    # whether each is held too: a run whose training stopped without writing its weights is broken from then on
    return _runs(str(root), tuple((str(d), stamp(d, ("", "results", *RUN_FILES)), holder(d) is not None) for d in dirs))


@st.cache_resource(show_spinner="Loading model...", max_entries=8)
def _model(path: str, version: tuple, device: str):
    return load_model(path, device=device).eval()


def model_at(path: str | Path):
    """The run's model on the sidebar's device, loaded once per version of its weights."""
    return _model(str(path), stamp(Path(path)), device())


def device() -> str:
    """Where page models load and jobs run: the sidebar's choice where this machine has it, else cpu."""
    chosen = st.session_state.get(DEVICE_KEY, "cpu")
    return chosen if device_problem(chosen) is None else "cpu"


def device_problem(chosen: str) -> str | None:
    """Why this machine cannot run on ``chosen`` (None: it can)."""
    if chosen == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "Device cuda refused: this machine has no CUDA device (torch.cuda.is_available() is False); pages and jobs run on the cpu."
    return None


def device_picker() -> None:
    """The sidebar's device: every page's model and every analysis job (``--device``) use it."""
    with st.sidebar:
        chosen = st.selectbox(
            "Device",
            DEVICES,
            key=DEVICE_KEY,
            help="Where page models load and analysis jobs (probes, dynamics, traces) run: `--device` of the CLI, whose "
            "default is cpu. Training a zoo runs on the cpu (train.device in a run's config for a GPU).",
        )
        if problem := device_problem(chosen):
            st.error(problem)


THREADS_KEY = "job_threads"


def threads_picker() -> None:
    """The sidebar's torch threads for analysis jobs, shared among the jobs running at once."""
    with st.sidebar:
        st.number_input(
            "Job threads",
            min_value=1,
            max_value=max(1, os.cpu_count() or 1),
            value=min(os.cpu_count() or 1, 4),
            key=THREADS_KEY,
            help="Torch threads of an analysis job (probes, dynamics, SAEs, traces): divided among the jobs running "
            "when it starts, so jobs side by side do not oversubscribe the cores (1 each on 2 cores). `--threads` of the CLI.",
        )


def job_threads(running: int) -> int:
    """Threads for a job that starts beside ``running`` others: the sidebar's budget divided among them."""
    budget = int(st.session_state.get(THREADS_KEY) or min(os.cpu_count() or 1, 4))
    return max(1, budget // (running + 1))


def model(run: RunInfo):
    return model_at(run.path)


@st.cache_resource(show_spinner=False, max_entries=16)
def _tokenizer(path: str, version: tuple) -> TokenizerBase:
    return tokenizer_of(path)


def tokenizer_at(path: str | Path) -> TokenizerBase:
    """The tokenizer of the run at ``path`` (the character one of the zoo, or an imported model's
    BPE), loaded once per version of its files: every page encodes and decodes with it."""
    return _tokenizer(str(path), stamp(Path(path), TOKENIZER_FILES))


def tokenizer(run: RunInfo) -> TokenizerBase:
    """``tokenizer_at`` the run; one that cannot be read stops the page with an error element."""
    try:
        return tokenizer_at(run.path)
    except Exception as err:  # noqa: BLE001 - shown, not raised, like every failure of a computation
        st.error(f"Reading the tokenizer of {run.name} failed: {type(err).__name__}: {err}")
        st.stop()


@st.cache_data(show_spinner=False, max_entries=64)
def _run_task(path: str, version: tuple) -> RunTask:
    return Run.open(path).task


def run_task_at(path: str | Path) -> RunTask:
    """The task the run at ``path`` trained on (``Run.task``): every page's default input."""
    return _run_task(str(path), stamp(Path(path), ("config.json",)))


def run_task(run: RunInfo) -> RunTask:
    return run_task_at(run.path)


@st.cache_data(show_spinner=False, max_entries=64)
def _default_prompt(path: str, version: tuple) -> str | None:
    task = Run.open(path).task
    return None if task.spec is None else task.prompt(tokenizer=tokenizer_of(path))


def default_prompt(run: RunInfo) -> str | None:
    """The prompt of the first held-out problem of the run's own task; None where it records no task."""
    return _default_prompt(str(run.path), stamp(run.path, ("config.json", *TOKENIZER_FILES)))


def input_warnings(chosen: list[RunInfo], *, prompt: str | None = None, task: str | None = None) -> list[dict]:
    """Each chosen run's input record (``RunTask.input_record``) for a prompt or task given on the
    page, with a warning element for each run the input is not the task of."""
    records = []
    for run in chosen:
        record = run_task(run).input_record(task, prompt=prompt, run=run.name)
        if "warning" in record:
            st.warning(record["warning"], icon=":material/warning:")
        records.append(record)
    return records


def tokenizer_summary(tok: TokenizerBase) -> str:
    """One line naming a tokenizer: its kind, vocabulary size and whether it has a chat template."""
    kind = "character-level" if tok.kind == "char" else "Hugging Face (subword)"
    return f"{kind}, {tok.vocab_size:,} ids" + (", chat template" if tok.chat_template else "")


def pieces(tok: TokenizerBase, text: str) -> list[str]:
    """``text`` as the tokenizer splits it, each token decoded alone (subwords, not characters)."""
    return [tok.decode([i], skip_special=False) for i in tok.encode(text)]


@overload
def pick_run(
    label: str,
    *,
    archs: tuple[str, ...] | None = None,
    needs: str = "",
    key: str,
    multiple: Literal[False] = False,
    default: list[str] | None = None,
    max_selections: int | None = None,
) -> RunInfo | None: ...


@overload
def pick_run(
    label: str,
    *,
    archs: tuple[str, ...] | None = None,
    needs: str = "",
    key: str,
    multiple: Literal[True],
    default: list[str] | None = None,
    max_selections: int | None = None,
) -> list[RunInfo]: ...


def pick_run(
    label: str,
    *,
    archs: tuple[str, ...] | None = None,
    needs: str = "",
    key: str,
    multiple: bool = False,
    default: list[str] | None = None,
    max_selections: int | None = None,
) -> RunInfo | None | list[RunInfo]:
    """A run chooser over the usable runs (of ``archs``); None (or []) with a message if there are
    none, which names the usable runs of other architectures and why the page cannot use them (``needs``)."""
    every = [r for r in runs() if r.usable]
    usable = [r for r in every if archs is None or r.arch in archs]
    if not usable:
        kinds = " or ".join(archs) if archs else "any"
        why = f": {needs}" if needs else ""
        others = (
            f" Usable runs here, of other architectures: {', '.join(f'{r.name} ({r.arch})' for r in every)}." if every else ""
        )
        st.info(
            f"No usable {kinds} runs under {runs_root()}{why}.{others} Train the zoo from the Runs page, or point the sidebar at a runs directory."
        )
        return [] if multiple else None
    names = [r.name for r in usable]
    by_name = {r.name: r for r in usable}
    if multiple:
        chosen = st.multiselect(
            label,
            names,
            default=[n for n in (default or names[:1]) if n in names][:max_selections],
            key=key,
            max_selections=max_selections,
        )
        picked = [by_name[n] for n in chosen]
        plumbing_notice(picked)
        return picked
    preferred = next((n for n in names for d in default or [] if n.endswith(d)), names[0])
    run = by_name[st.selectbox(label, names, index=names.index(preferred), key=key)]
    plumbing_notice([run])
    return run


def follow(key: str, depends_on: object, default: object) -> None:
    """Set the widget ``key`` to ``default`` whenever ``depends_on`` (what its options come from:
    the chosen run, the results drawn) differs from when it was last set here. A keyed widget keeps
    its value across reruns even when its options change, so without this a choice made for one run
    silently carries over to another (the Probes page probed 3 of a 4-layer run's 5 hooks). Create
    the widget after this call, without a default of its own (its value is the session state's)."""
    marker = f"{key}__follows"
    if key not in st.session_state or st.session_state.get(marker) != depends_on:
        st.session_state[key] = default
        st.session_state[marker] = depends_on


PLUMBING = (
    "from the micro zoo: a plumbing check trained for seconds. What this page shows of it exercises the "
    "code and says nothing about the effects studied; train the quick zoo or the organisms (the Runs page) for models "
    "that learned their tasks."
)


def plumbing_notice(chosen: list[RunInfo]) -> None:
    """A warning naming the chosen runs that are plumbing checks (members of a micro zoo or study)."""
    names = [r.name for r in chosen if r.plumbing_check]
    if names:
        st.warning(f"{', '.join(names)}: {PLUMBING}")


def find(runs_: list[RunInfo], *suffixes: str) -> list[str]:
    """Names of runs whose name ends with each suffix (the zoo's members, wherever they live)."""
    names = []
    for suffix in suffixes:
        names += [r.name for r in runs_ if (r.name == suffix or r.name.endswith("/" + suffix)) and r.name not in names][:1]
    return names


@contextlib.contextmanager
def shown_errors(what: str):
    """Show a failure as an error element with its message (no traceback in the page)."""
    try:
        yield
    except ScriptControlException:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of a computation is shown, not raised
        st.error(f"{what} failed: {type(err).__name__}: {err}")


def show_text(text: str) -> None:
    """``text`` verbatim in a code box (leading and trailing newlines kept: a chat prompt ends with one)."""
    st.code(f"\n{text}\n", language=None, wrap_lines=True)  # st.code drops one newline at each end


def _visible(char: str) -> str:
    """A character as a token box shows it: space, newline and other control characters as symbols."""
    if char in " \n":
        return "␣" if char == " " else "⏎"
    return chr(0x2400 + ord(char)) if ord(char) < 32 else char  # Unicode's control pictures: ␉ for a tab


def token_strip(tokens: list[str], rows: dict[str, list[float | None]], shade: str | None = None) -> str:
    """HTML: each token in a box with the rows' values under it; boxes shaded by row ``shade``."""
    values = [v for v in rows.get(shade, []) if v is not None] if shade else []
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    cells = []
    for i, tok in enumerate(tokens):
        shown = "⟂" if tok == "<eos>" else "".join(map(_visible, tok))  # subwords hold spaces and newlines too
        v = rows[shade][i] if shade and i < len(rows[shade]) else None
        alpha = 0.08 + 0.6 * ((v - lo) / (hi - lo) if v is not None and hi > lo else 0.0)
        numbers = "".join(
            f"<div style='font-size:9px;color:#555'>{'' if vals[i] is None else f'{vals[i]:.2f}'}</div>"
            for vals in rows.values()
            if i < len(vals)
        )
        cells.append(
            f"<div title='{html.escape(tok)}' style='display:inline-block;margin:1px;padding:1px 2px;"
            f"text-align:center;border-radius:3px;background:rgba(31,119,180,{alpha:.2f});min-width:16px'>"
            f"<div style='font-family:monospace'>{html.escape(shown)}</div>{numbers}</div>"
        )
    legend = " / ".join(rows) if rows else ""
    return f"<div style='line-height:1.1'>{''.join(cells)}</div><div style='font-size:10px;color:#777'>under each token: {legend}</div>"
