"""The kernel counter: exact counts on hand-made cases, the numerics guard's constant cost per
decode step, and the committed per-layer counts (docs/benchmarks.md) recomputed."""

import json
from pathlib import Path

import pytest
import torch

from workbench.runtime.config import build_model
from workbench.runtime.kernels import count_kernels, per_layer, per_step

ROOT = Path(__file__).resolve().parents[2]


def test_views_and_allocations_launch_nothing():
    x, w = torch.randn(3, 4), torch.randn(4, 5)

    def f():
        y = x @ w  # mm
        z = y.t().reshape(-1)  # t (a view); reshape of a non-contiguous tensor: clone, _unsafe_view
        return (y.view(-1) + 1, z, torch.empty(3))  # view, add; empty allocates

    _, counter = count_kernels(f)
    assert dict(counter.ops) == {"aten.mm": 1, "aten.clone": 1, "aten.add": 1}
    assert counter.launching == 3
    assert counter.views == 4  # t, _unsafe_view, view, empty


def test_per_step_refuses_a_step_count_off_the_read_interval():
    with pytest.raises(ValueError, match="multiple of 16"):
        per_step(build_model("baseline", "debug"), [[1, 2]], steps=10)


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_the_numerics_guard_costs_the_same_few_operations_whatever_the_depth(engine):
    """The guard sums every record of a step in one reduction and reads the sums every 16 steps, so
    what it adds to a step is a constant, not an operation per norm."""
    added = []
    for n_layers in (2, 4):
        model = build_model("fbt", "debug", n_layers=n_layers)
        on, off = (per_step(model, [[1, 2, 3]], regime="soft", engine=engine, check_numerics=c) for c in (True, False))
        added.append(on["launching"] - off["launching"])
    assert added[0] == added[1], added
    assert 0 < added[0] <= 4, added


@pytest.mark.slow
def test_the_committed_kernel_counts_recompute():
    committed = json.loads((ROOT / "docs/results/kernel_counts.json").read_text())
    row = next(r for r in committed["rows"] if r["arch"] == "baseline" and r["engine"] == "static")
    counted = per_layer("baseline", committed["preset"], regime=row["regime"], engine="static")
    assert counted["launching"] == row["per_layer"]["launching"]
    assert counted["ops"] == row["per_layer"]["ops"]
    page = (ROOT / "docs/benchmarks.md").read_text()
    for r in committed["rows"]:  # the page's table states the committed counts
        if r["label"] == "baseline":
            assert f"| baseline | {r['engine']} | {r['per_layer']['launching']:g}" in page
            assert f"{r['per_layer']['outside_layers']:.1f}" in page and f"{r['guard_per_step']:.2f}" in page


def test_the_readme_quotes_the_committed_per_layer_counts():
    committed = json.loads((ROOT / "docs/results/kernel_counts.json").read_text())
    static, eager = (
        next(r for r in committed["rows"] if r["label"] == "baseline" and r["engine"] == e) for e in ("static", "eager")
    )
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"a static or compiled decode step launches {static['per_layer']['launching']:g} kernels a layer where an eager one "
        f"launches {eager['per_layer']['launching']:g}"
    ) in readme
