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


def test_the_readme_names_no_path_outside_a_users_clone():
    """Issue #38: a user's clone has no ``../shared``; the README's commands use paths the user
    makes (``data/``, git-ignored, with where GSM8K comes from said beside it)."""
    text = (ROOT / "README.md").read_text()
    assert "../shared" not in text
    assert "data/gsm8k/train.jsonl" in text and "github.com/openai/grade-school-math" in text
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "/data/" in ignored and "/corpora/" in ignored
