#!/usr/bin/env python3
"""Add each comparison study's declared family of comparisons, Holm-corrected with simultaneous
intervals (``workbench.experiments.comparisons.study_family``), for the study JSON files measured before
``run_study`` wrote it: ``docs/results/study_families.json``, read by their results pages.

    python scripts/study_families.py     # then python scripts/results_pages.py
"""

from __future__ import annotations

import json
from pathlib import Path

from workbench.experiments.comparisons import study_family
from workbench.storage.provenance import source_commit

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
STUDIES = ("study_data_efficiency.json", "study_three_pass.json", "study_hd_ablations.json")


def main() -> None:
    families = {name: study_family(json.loads((RESULTS / name).read_text())) for name in STUDIES}
    out = {"written_by": "python scripts/study_families.py", "commit": source_commit(), "families": families}
    (RESULTS / "study_families.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
