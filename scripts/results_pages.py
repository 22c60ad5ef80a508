#!/usr/bin/env python3
"""Render the measured-results pages in docs/results/ from the JSON files next to them, and check
that every committed figure and screenshot was drawn by the code as it is now.

    python scripts/results_pages.py              # (re)write docs/results/*.md
    python scripts/results_pages.py --figures    # also redraw docs/results/*.png (the venv: matplotlib, workbench)
    python scripts/results_pages.py --check      # exit 1, naming the page or figure, if any is stale

Every number on a generated page is read from a JSON file in docs/results/; the only text typed
in here is prose, column names, and the command behind a JSON file that does not record its own
(copied from the docs that quoted it). The topic pages (docs/*.md) keep the interpretation and
link to these pages. The pages and the check are standard library only (and git); only
``--figures`` imports the workbench's drawing functions.

A figure (docs/results/figures.json) or screenshot (docs/app/screenshots.json, written by
tests/integration/test_browser.py) is recorded with the commit HEAD was at when it was drawn, the
code that draws it, any of that code that differed from the commit then, and the PNG's sha256.
``--check`` fails naming the PNG when the code that draws it changed in a commit after the recorded
one, when it was drawn from uncommitted code, when the PNG or (for a figure) its JSON data is not
what was recorded, or when a PNG has no record.

The pages are declared in scripts/pages/, a module per family of pages, each page a spec
(``pages.render.Page``: its JSON files, title and sections) that ``pages.render.render`` turns into
Markdown; this file lists them (``PAGES``, and the organisms' pages found in the folder), writes
the index and runs the command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

# The pages package beside this file: importable also where this file is loaded by its path (the
# tests do), so that scripts/ is not on sys.path.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from pages import bench, dynamics, pretrained, probes, studies, traces, zoo  # noqa: E402
from pages.drawings import (  # noqa: E402
    FIGURES,
    FIGURES_COMMAND,
    FIGURES_MANIFEST,
    SCREENSHOT_CODE,
    SCREENSHOT_PAGES,
    SCREENSHOTS,
    SCREENSHOTS_COMMAND,
    SCREENSHOTS_MANIFEST,
    draw_figures,
    drawing_problems,
    figure_and_screenshot_problems,
    git_checkout,
    record_drawing,
    sha256,
)
from pages.organisms import (  # noqa: E402
    CLAIMS_JSON,
    ORGANISM_NAMES,
    ORGANISM_STUDIES,
    claims_page,
    organism_pages,
    organism_study_name,
)
from pages.render import Page, render, seed_cell  # noqa: E402
from pages.sources import RESULTS, ROOT, SCRIPT, shown  # noqa: E402
from pages.studies import (  # noqa: E402
    data_efficiency_table,
    hd_ablations_paired_table,
    hd_ablations_table,
    three_pass_paired_table,
    three_pass_tables,
)
from pages.traces import traces_table  # noqa: E402
from pages.zoo import readings_table, zoo_loss_table, zoo_table  # noqa: E402

__all__ = [  # what other code uses of this module: scripts/regenerate_organisms.py and the tests
    "CLAIMS_JSON",
    "FIGURES",
    "ORGANISM_NAMES",
    "ORGANISM_STUDIES",
    "SCREENSHOT_CODE",
    "SCREENSHOT_PAGES",
    "SCREENSHOTS_COMMAND",
    "SCREENSHOTS_MANIFEST",
    "claims_page",
    "data_efficiency_table",
    "drawing_problems",
    "figure_and_screenshot_problems",
    "git_checkout",
    "hd_ablations_paired_table",
    "hd_ablations_table",
    "main",
    "organism_pages",
    "organism_study_name",
    "readings_table",
    "record_drawing",
    "render_all",
    "seed_cell",
    "sha256",
    "three_pass_paired_table",
    "three_pass_tables",
    "traces_table",
    "zoo_loss_table",
    "zoo_table",
]

# Each page: its line in the index, and its spec (or the function of the results folder that
# makes the spec of a page whose sources depend on what the folder holds).
PAGES: dict[str, tuple[str, Page | Callable[[Path], Page]]] = {
    "zoo.md": ("the earlier reference zoo (one seed): accuracy, losses, train time", zoo.ZOO),
    "zoo_seeds.md": (
        "the reference zoo at three seeds: accuracy with intervals, competence, time",
        zoo.zoo_seeds("zoo_cpu_seeds.json"),
    ),
    "zoo_quick.md": (
        "the earlier quick first-run zoo (before the organisms): accuracy, competence, time",
        zoo.zoo_seeds("zoo_quick.json"),
    ),
    **{
        f"zoo_org_{task}.md": (
            f"the {task} organism's zoo at five seeds: accuracy with intervals, competence, time",
            zoo.zoo_seeds(f"zoo_org_{task}.json"),
        )
        for task in ("flipflop", "perm", "addition")
    },
    "study_data_efficiency.md": (
        "FBT data efficiency: validation loss and the baseline's token ratio across seeds",
        studies.DATA_EFFICIENCY,
    ),
    "study_three_pass.md": (
        "FBT's stability knob: K-pass residual, Lyapunov exponents, regrowth and accuracy by 3-pass fraction",
        studies.three_pass("study_three_pass.json"),
    ),
    "study_hd_ablations.md": (
        "Hidden Decoding's ablations: accuracy, loss jumps at expansion and step cost by member, paired by seed",
        studies.hd_ablations("study_hd_ablations.json"),
    ),
    "study_fbt_vs_baseline.md": (
        "FBT against the baseline on modsum: matched initialisation, per-architecture tuning, Holm-corrected family",
        studies.fbt_vs_baseline("study_fbt_vs_baseline.json"),
    ),
    "study_fbt_vs_baseline_flipflop.md": (
        "FBT against the baseline on flip-flop, the same study",
        studies.fbt_vs_baseline("study_fbt_vs_baseline_flipflop.json"),
    ),
    "zoo_analyses.md": ("the three-seed zoo's probes, dynamics and traces, each reading across seeds", zoo.SEED_READINGS),
    "probes.md": ("the layer-0 probe study", probes.probes),
    "dynamics.md": ("feedback-map stability", dynamics.DYNAMICS),
    "traces.md": ("trace lengths", traces.TRACES),
    "bench.md": ("speed ratios", bench.bench),
    "pretrained.md": ("SmolLM2-135M-Instruct imported: parity, traces, a probe", pretrained.PRETRAINED),
    "cpt.md": ("SmolLM2-135M-Instruct continued on GSM8K as FBT and HD: memory, curves, eval, FLOPs", pretrained.CPT),
}


def all_pages(results: Path) -> dict[str, tuple[str, Page | Callable[[Path], Page]]]:
    return {**PAGES, **organism_pages(results)}


def index_page(results: Path) -> str:
    lines = [
        "# Measured results",
        "",
        f"Generated by `{SCRIPT}`; do not edit by hand. One page per study, each rendered from the JSON",
        "files in this folder, which the command named on the page wrote. The topic pages in `docs/` say",
        "what the numbers mean.",
        "",
    ]
    lines += [f"- [{page}]({page}): {what}" for page, (what, _) in all_pages(results).items()]
    lines += [
        "",
        f"Figures: {', '.join(f'[`{name}`]({name})' for name in FIGURES)}, drawn from the JSON here by "
        f"`{FIGURES_COMMAND}` with the",
        f"workbench's drawing functions; [`{FIGURES_MANIFEST}`]({FIGURES_MANIFEST}) records the commit each was drawn "
        f"from, and `{SCRIPT} --check`",
        "fails once the code that draws one changes in a later commit (docs/development.md).",
    ]
    return "\n".join(lines) + "\n"


def render_all(results: Path = RESULTS) -> dict[str, str]:
    pages = {page: render(spec, results) for page, (_, spec) in all_pages(results).items()}
    pages["README.md"] = index_page(results)
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if any generated page differs from what it would render now, or a figure is stale",
    )
    parser.add_argument("--figures", action="store_true", help="also redraw the figures with the current drawing code")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the folder of JSON files, pages and figures (default: docs/results)"
    )
    parser.add_argument(
        "--screenshots",
        type=Path,
        help="the app's screenshots to check (default: docs/app, unless --results names another folder)",
    )
    args = parser.parse_args(argv)
    screenshots = args.screenshots or (SCREENSHOTS if args.results == RESULTS else None)
    if args.check:
        pages = render_all(args.results)
        stale = [
            page
            for page, text in pages.items()
            if not (args.results / page).is_file() or (args.results / page).read_text() != text
        ]
        for page in stale:
            print(f"{shown(args.results / page)} is stale: run `{SCRIPT}` and commit the result", file=sys.stderr)
        figures = figure_and_screenshot_problems(args.results, screenshots, ROOT)
        for problem in figures:
            print(problem, file=sys.stderr)
        return 1 if stale or figures else 0
    if args.figures:
        for path in draw_figures(args.results):
            print(f"drew {shown(path)}")
    for page, text in render_all(args.results).items():
        path = args.results / page
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
