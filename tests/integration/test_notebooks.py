"""The study notebooks run top to bottom in SMOKE mode on a copy of the micro zoo, draw at least
one figure each, and are committed without outputs, with a ``parameters`` cell first."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = ["01_layer0_probes.ipynb", "02_feedback_dynamics.ipynb", "03_trace_lengths.ipynb", "04_hidden_decoding_streams.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_smoke_mode_and_draws(name, micro_zoo, tmp_path, monkeypatch):
    runs = shutil.copytree(micro_zoo, tmp_path / "runs")  # notebooks write results into the zoo
    monkeypatch.setenv("WORKBENCH_SMOKE", "1")  # the kernel inherits the environment
    monkeypatch.setenv("WORKBENCH_RUNS", str(runs))
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    images = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs if "image/png" in out.get("data", {})]
    assert images, f"{name} ran but displayed no figure"
    assert (runs / "notebook_results" / name[:2]).is_dir()


def test_notebooks_are_committed_stripped_with_a_parameters_cell_first():
    paths = [NOTEBOOK_DIR / name for name in NOTEBOOKS]
    assert sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb")) == NOTEBOOKS
    nbstripout = Path(sys.executable).parent / "nbstripout"
    assert nbstripout.is_file(), f"nbstripout is not installed next to {sys.executable} (pip install -e '.[test]')"
    result = subprocess.run([str(nbstripout), "--verify", *map(str, paths)], capture_output=True, text=True)
    assert result.returncode == 0, f"notebooks have outputs or metadata to strip:\n{result.stdout}{result.stderr}"
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata.kernelspec.name == "python3", path.name
        first = next(cell for cell in nb.cells if cell.cell_type == "code")
        assert "parameters" in first.metadata.get("tags", []), f"{path.name}: first code cell is not tagged 'parameters'"
        assert re.search(r"^SMOKE\s*=", first.source, re.M), f"{path.name}: the parameters cell does not define SMOKE"
