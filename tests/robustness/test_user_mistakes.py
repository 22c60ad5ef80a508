"""Guarantee: no traceback for a user's mistake; a count of nothing is refused before any work."""

import pytest
from helpers import cli


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--arch", "baseline", "--preset", "debug", "--stop-after", "-1"],
        ["train", "--arch", "baseline", "--preset", "debug", "--stop-after", "0"],
        ["sae", "RUN", "--saelens-activations", "--context-size", "0"],
    ],
    ids=["stop-after -1", "stop-after 0", "sae context-size 0"],
)
def test_a_count_below_one_is_a_usage_error_before_any_work(argv, tmp_path):
    argv = [str(tmp_path / "run") if a == "RUN" else a for a in argv]
    code, _, err = cli([*argv, "--out", str(tmp_path / "out")])
    assert (
        code == 2
        and "Traceback" not in err
        and err.strip().splitlines()[-1].endswith(f"expected an integer >= 1, got {argv[-1]!r}")
    )
    assert not (tmp_path / "out").exists()


def test_a_runs_directory_whose_name_no_file_system_holds_is_refused_once(tmp_path):
    from workbench.runs import within_root
    from workbench.storage.errors import BadInput

    with pytest.raises(BadInput, match="not a usable path .*File name too long"):
        within_root("a" * 300, tmp_path)
    assert within_root("a" * 255, tmp_path) == tmp_path.resolve() / ("a" * 255)
