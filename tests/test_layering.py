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
    allowed = {"torch", "transformer_lens", "einops", "models", "__future__", "dataclasses", "math", "typing", "copy"}
    for f in (ROOT / "models").rglob("*.py"):
        assert imported_roots(f) <= allowed, (f, imported_roots(f) - allowed)
