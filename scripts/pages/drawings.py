"""The committed figures and screenshots: which figures this script draws (``FIGURES``: from which
JSON files, by which code), the record kept of each drawing (the commit HEAD was at, the code that
drew it and any of that code that differed from the commit, the PNG's sha256), and ``--check``'s
part that compares every PNG with its record and the code's later commits. Standard library and
git; only drawing a figure (``draw_figures``) imports matplotlib and the workbench, inside the call."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from .sources import RESULTS, ROOT, SCRIPT, read, shown

FIGURES_MANIFEST = "figures.json"  # beside the figures in docs/results
SCREENSHOTS = ROOT / "docs" / "app"
SCREENSHOTS_MANIFEST = "screenshots.json"  # beside the screenshots; tests/integration/test_browser.py writes both
FIGURES_COMMAND = f"{SCRIPT} --figures"
# The browser test shoots every page of the app, in this order, over a copy of the quick zoo.
SCREENSHOT_PAGES = ("runs", "zoo", "probes", "sae", "dynamics", "traces", "streams", "playground")
SCREENSHOTS_COMMAND = (
    "WORKBENCH_SCREENSHOTS=docs/app WORKBENCH_BROWSER_RUNS=runs/quick WORKBENCH_REQUIRE_BROWSER=1 "
    ".venv/bin/python -m pytest tests/integration/test_browser.py -k every_page"
)
# What draws a screenshot: the pages and their charts, the regime palette, and the test that drives the
# browser (what it clicks and the viewport). The workbench functions behind the numbers a page shows are
# not counted: a screenshot shows a page, not a study's result.
SCREENSHOT_CODE = ("app", "workbench/runtime/palette.py", "tests/integration/test_browser.py")


class FigureSpec(NamedTuple):
    """A committed figure: the JSON files in docs/results it is drawn from, the code that draws it
    (repository paths: what the check's commit rule watches), what the drawing call takes besides
    the data (made from the data; recorded and compared), and the call."""

    data: tuple[str, ...]
    code: tuple[str, ...]
    args: Callable[[Path], dict]
    draw: Callable[[Path, Path, dict], object]


def probe_sweep_figure(name: str) -> FigureSpec:
    """A probe sweep's figure as ``workbench probe`` draws it (``plot_probe_rows``: its size, dpi,
    ticks and palette), from the sweep's committed rows."""

    def args(results: Path) -> dict:
        sweep = read(results, name)
        return {"title": f"{Path(sweep['run']).name}: probing {sweep['target']}", "arch": sweep.get("arch")}

    def draw(results: Path, path: Path, args: dict):
        from workbench.probing.study import plot_probe_rows

        return plot_probe_rows(read(results, name)["rows"], path, args["title"], args["arch"])

    return FigureSpec((name,), ("workbench/probing/study.py", "workbench/runtime/palette.py"), args, draw)


FIGURES: dict[str, FigureSpec] = {"probe_fbt_memory.png": probe_sweep_figure("probe_fbt_memory.json")}


def figures_of(name: str) -> list[str]:
    """The committed figures drawn from the JSON file ``name`` (``FIGURES``); a figure a JSON file
    lists (its study's own output directory) is not one of them unless this script draws it."""
    return [figure for figure, spec in FIGURES.items() if name in spec.data]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def git_checkout(repo: Path) -> bool:
    """Whether ``repo`` is the top of a git work tree (and git runs)."""
    try:
        top = git(repo, "rev-parse", "--show-toplevel")
    except OSError:
        return False
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == repo.resolve()


def record_drawing(code: Iterable[str], repo: Path = ROOT) -> dict:
    """What to record of a figure drawn now: HEAD's commit, and which of the ``code`` paths differ
    from it (changed, staged or untracked files under them); a figure drawn from those is not drawn
    from the commit, and the check says so until it is redrawn from a commit that has them."""
    code = list(code)
    head = git(repo, "rev-parse", "HEAD")
    if head.returncode != 0:
        raise RuntimeError(f"{repo}: no commit to record a drawing against ({head.stderr.strip()})")
    changed = git(repo, "diff", "--name-only", "HEAD", "--", *code).stdout.split("\n")
    untracked = git(repo, "ls-files", "--others", "--exclude-standard", "--", *code).stdout.split("\n")
    return {"commit": head.stdout.strip(), "uncommitted": sorted({p for p in changed + untracked if p})}


def commit_problems(name: str, entry: dict, code: list[str], command: str, repo: Path) -> list[str]:
    """The commit rule: ``name`` was drawn at ``entry['commit']``, a commit of HEAD's history, from
    committed code, and no later commit changed the ``code`` that draws it."""
    redraw = f"run `{command}` and commit the result"
    if entry.get("uncommitted"):
        return [f"{name} was drawn from uncommitted changes to {', '.join(entry['uncommitted'])}: commit them, then {redraw}"]
    commit = entry.get("commit")
    if not isinstance(commit, str) or git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return [f"{name}: its recorded commit {commit!r} is not in this repository: {redraw}"]
    if git(repo, "merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        return [f"{name} was drawn at {commit[:10]}, which is not in HEAD's history: {redraw}"]
    last = git(repo, "log", "-1", "--format=%H", "HEAD", "--", *code).stdout.strip()
    if last and git(repo, "merge-base", "--is-ancestor", last, commit).returncode != 0:
        later = git(repo, "log", "--format=%h", f"{commit}..HEAD", "--", *code).stdout.split()
        return [
            f"{name} is stale: drawn at {commit[:10]}, and the code that draws it ({', '.join(code)}) changed "
            f"since, in {', '.join(later)}: {redraw}"
        ]
    return []


def drawing_problems(
    folder: Path,
    manifest: str,
    expected: dict[str, dict],
    command: str,
    repo: Path | None,
) -> list[str]:
    """Everything wrong with the PNGs in ``folder`` against their ``manifest``: ``expected`` gives,
    per PNG that must be there, the ``code`` that draws it and any other recorded field that must
    equal what it is now (a figure's data hashes and drawing arguments). A PNG with no record, or a
    record with no PNG or another PNG's bytes, fails; ``repo`` None skips the commit rule."""
    path = folder / manifest
    entries = json.loads(path.read_text()) if path.is_file() else {}
    problems = []
    pngs = sorted(p.name for p in folder.glob("*.png"))
    for name in sorted(set(pngs) | set(entries) | set(expected)):
        shown_name = shown(folder / name)
        if name not in expected:
            what = "" if name in pngs else f", named in {shown(path)},"
            problems.append(
                f"{shown_name}{what} is not drawn by anything that records it: remove it, or draw it by code that does"
            )
            continue
        if name not in entries:
            problems.append(f"{shown_name} has no record in {shown(path)}: run `{command}`")
            continue
        if name not in pngs:
            problems.append(f"{shown_name}, recorded in {shown(path)}, is missing: run `{command}`")
            continue
        entry, want = entries[name], expected[name]
        if entry.get("sha256") != sha256(folder / name):
            problems.append(f"{shown_name} is not the file {shown(path)} records (sha256 differs): run `{command}`")
            continue
        differs = [key for key, value in want.items() if entry.get(key) != value]
        if differs:
            problems.append(f"{shown_name} was drawn with other {', '.join(differs)} than now: run `{command}`")
            continue
        if repo is not None:
            problems += commit_problems(shown_name, entry, list(want["code"]), command, repo)
    return problems


def expected_figures(results: Path) -> dict[str, dict]:
    return {
        name: {
            "code": list(spec.code),
            "data": {data: sha256(results / data) for data in spec.data},
            "args": spec.args(results),
        }
        for name, spec in FIGURES.items()
    }


def draw_figures(results: Path = RESULTS, repo: Path = ROOT) -> list[Path]:
    """Draw every figure of ``FIGURES`` into ``results`` with the current drawing code, and record
    each (``figures.json``)."""
    import matplotlib

    entries = {}
    for name, spec in FIGURES.items():
        drawing = record_drawing(spec.code, repo)  # before drawing: the code a figure is drawn with
        args = spec.args(results)
        spec.draw(results, results / name, args)
        entries[name] = {
            **drawing,
            "code": list(spec.code),
            "data": {data: sha256(results / data) for data in spec.data},
            "args": args,
            "matplotlib": matplotlib.__version__,
            "command": FIGURES_COMMAND,
            "sha256": sha256(results / name),
        }
    (results / FIGURES_MANIFEST).write_text(json.dumps(entries, indent=1) + "\n")
    return [results / name for name in entries]


def figure_and_screenshot_problems(results: Path, screenshots: Path | None, repo: Path) -> list[str]:
    """``--check``'s figures part: the result figures in ``results`` and (unless None) the app's
    screenshots; the commit rule where ``repo`` is a git checkout with its history."""
    checked: Path | None = repo
    if not git_checkout(repo):
        print(f"{repo} is not a git checkout: the commits figures were drawn at are not checked", file=sys.stderr)
        checked = None
    elif git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return [f"{repo} is a shallow clone: the commits figures were drawn at cannot be checked (git fetch --unshallow)"]
    problems = drawing_problems(results, FIGURES_MANIFEST, expected_figures(results), FIGURES_COMMAND, checked)
    if screenshots is not None:
        expected = {f"{page}.png": {"code": list(SCREENSHOT_CODE)} for page in SCREENSHOT_PAGES}
        problems += drawing_problems(screenshots, SCREENSHOTS_MANIFEST, expected, SCREENSHOTS_COMMAND, checked)
    return problems
