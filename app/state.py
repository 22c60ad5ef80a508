"""What every page shares: the runs directory, cached loaders, error display, and small
drawing helpers. Pages import from here; computation lives in ``workbench``."""

from __future__ import annotations

import contextlib
import html
import os
from pathlib import Path

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

from workbench.runs import RunInfo, exposure_warning, find_run_dirs, list_runs, within_root
from workbench.runtime.checkpoint import load_model

ROOT_KEY, INPUT_KEY, REFUSED_KEY = "runs_root", "runs_root_input", "runs_root_refused"
RUN_FILES = ("config.json", "model.safetensors", "metrics.jsonl", "results/eval.json")


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
            help=f"{app_root()} (the runs root) or a directory under it; its subdirectories (up to 3 levels deep) are run directories.",
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
    return _runs(str(root), tuple((str(d), stamp(d, ("", "results", *RUN_FILES))) for d in dirs))


@st.cache_resource(show_spinner="Loading model...", max_entries=8)
def _model(path: str, version: tuple):
    return load_model(path).eval()


def model_at(path: str | Path):
    """The run's model, loaded once per version of its weights."""
    return _model(str(path), stamp(Path(path)))


def model(run: RunInfo):
    return model_at(run.path)


def pick_run(
    label: str,
    *,
    archs: tuple[str, ...] | None = None,
    key: str,
    multiple: bool = False,
    default: list[str] | None = None,
    max_selections: int | None = None,
):
    """A run chooser over the usable runs (of ``archs``); None (or []) with a message if there are none."""
    usable = [r for r in runs() if r.usable and (archs is None or r.arch in archs)]
    if not usable:
        kinds = " or ".join(archs) if archs else "any"
        st.info(
            f"No usable {kinds} runs under {runs_root()}. Train the zoo from the Runs page, or point the sidebar at a runs directory."
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
        return [by_name[n] for n in chosen]
    preferred = next((n for n in names for d in default or [] if n.endswith(d)), names[0])
    return by_name[st.selectbox(label, names, index=names.index(preferred), key=key)]


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


def token_strip(tokens: list[str], rows: dict[str, list[float | None]], shade: str | None = None) -> str:
    """HTML: each token in a box with the rows' values under it; boxes shaded by row ``shade``."""
    values = [v for v in rows.get(shade, []) if v is not None] if shade else []
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    cells = []
    for i, tok in enumerate(tokens):
        shown = {"\n": "⏎", " ": "␣", "<eos>": "⟂"}.get(tok, tok)
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
