"""The commit a result records (workbench.storage.provenance.source_commit), on a git repository
made here: clean, dirty by a change to the code, and clean again when only the tools' outputs under
docs/results changed (as they do between the steps of a regeneration)."""

import subprocess

from workbench.storage.provenance import source_commit


def test_source_commit_is_dirty_for_code_not_for_written_results(tmp_path):
    git = lambda *args: subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True)
    git("init", "-q")
    (tmp_path / "workbench").mkdir()
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "workbench" / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "results" / "study.json").write_text("{}\n")
    (tmp_path / "docs" / "notes.md").write_text("a\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = git("rev-parse", "HEAD").stdout.strip()
    assert source_commit(tmp_path) == head
    (tmp_path / "docs" / "results" / "study.json").write_text('{"readings": 1}\n')  # a tool's output
    (tmp_path / "untracked.py").write_text("y = 2\n")
    assert source_commit(tmp_path) == head
    (tmp_path / "docs" / "notes.md").write_text("b\n")  # anything else tracked
    assert source_commit(tmp_path) == head + "+dirty"
    git("checkout", "docs/notes.md")
    (tmp_path / "workbench" / "code.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == head + "+dirty"
    assert source_commit(tmp_path / "workbench") is None  # not the checkout's top
