"""models <- workbench <- app, notebooks: imports flow one way."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = {"models": {"workbench", "app", "streamlit"}, "workbench": {"app", "streamlit"}}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(RULES))
def test_layering(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    bad = {str(f.relative_to(ROOT)): sorted(imported_roots(f) & RULES[package]) for f in files}
    assert not {f: b for f, b in bad.items() if b}


def test_models_import_only_torch_and_hook_points():
    allowed = {
        "torch",
        "transformer_lens",
        "einops",
        "models",
        "__future__",
        "dataclasses",
        "math",
        "typing",
        "collections",
        "copy",
    }
    for f in (ROOT / "models").rglob("*.py"):
        assert imported_roots(f) <= allowed, (f, imported_roots(f) - allowed)


# Wings of ``workbench``, bottom to top: a module imports only from its own wing or the ones below.
# probing, dynamics and studies share a rank and do not import each other; the top modules (the cli,
# bench and experiments packages, demo, jobs, runs) may import anything. Below every wing, names
# imports nothing, so any module may read it.
WING_RANK = {"storage": 0, "runtime": 1, "data": 2, "training": 3, "probing": 4, "dynamics": 4, "studies": 4}
TOP = 5
TOP_PACKAGES = {"bench", "cli", "experiments"}  # top modules split into a package: they may import anything
BOTTOM = {"names"}


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "workbench" else None


def workbench_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("workbench.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("workbench"):
            found |= {f"{node.module}.{alias.name}" if node.module == "workbench" else node.module for alias in node.names}
    return found


def test_workbench_imports_flow_down_the_wings():
    files = sorted((ROOT / "workbench").rglob("*.py"))
    bad = []
    for f in files:
        parts = f.relative_to(ROOT / "workbench").parts
        own = parts[0] if len(parts) > 1 else None
        if own in TOP_PACKAGES:
            continue
        rank = WING_RANK[own] if own else TOP
        for module in workbench_imports(f):
            wing = wing_of(module)
            if wing in BOTTOM:
                continue
            if wing not in WING_RANK:  # the package itself or a top module
                if own is not None:
                    bad.append((str(f.relative_to(ROOT)), module))
                continue
            if wing != own and WING_RANK[wing] >= rank:
                bad.append((str(f.relative_to(ROOT)), module))
    assert not bad, bad


def test_every_workbench_module_sits_in_a_wing_or_the_top():
    top = {p.stem for p in (ROOT / "workbench").glob("*.py")} - {"__init__"} - BOTTOM
    assert top == {"demo", "jobs", "runs"}, top
    packages = {p.name for p in (ROOT / "workbench").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages == set(WING_RANK) | TOP_PACKAGES


def test_the_bottom_modules_import_nothing():
    """``workbench.names`` sits below every wing: it imports no module at all (the CLI's parser reads
    it without loading torch)."""
    for name in BOTTOM:
        assert imported_roots(ROOT / "workbench" / f"{name}.py") == set(), name


def test_no_cli_module_is_over_600_lines():
    long = {p.name: n for p in (ROOT / "workbench" / "cli").glob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
