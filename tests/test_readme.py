"""The README's quick start stays true: CI runs its test command verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line for line in lines if line.startswith("python3 -m venv .venv")]


def test_ci_runs_the_readme_test_command():
    main_job, test_command = _commands()
    assert main_job.endswith("workbench app") and "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()
