"""The studies' matplotlib figures as Figure and Axes objects (titles, labels, limits, ticks,
legend entries, colours), on small made-up results shaped like the studies'."""

import itertools
import random
from pathlib import Path

import pytest
import torch
from matplotlib.colors import to_hex

from workbench.dynamics.study import FIGURES, dynamics_figures
from workbench.probing.study import probe_figure
from workbench.runtime.decoding import REGIMES
from workbench.runtime.palette import REGIME_COLORS, regime_color
from workbench.studies.traces import summarise, traces_figure

ROOT = Path(__file__).resolve().parents[2]

NAMES = ("fbt-3pass0.03-seed1-long-name", "fbt-no3pass-seed2-long-name")  # long: side-by-side titles must not collide


def dynamics_results(names=NAMES, steps=60, d=8):
    """``analyse_run`` reports and rollout states, with an eigenvalue far outside the unit circle."""
    g = torch.Generator().manual_seed(0)
    results, states = {}, {}
    for name in names:
        S = torch.randn(steps, d, generator=g).cumsum(0)
        eig = (0.5 * torch.randn(d, 2, generator=g)).tolist()
        eig[0] = [2.5, 0.1]
        point = lambda t, label, S=S: {
            "state": S[t].tolist(),
            "stable": label == "stable",
            "label": label,
            "spectral_radius": 0.5,
        }
        results[name] = {
            "per_step": {
                "state_norm": S.norm(dim=1).tolist(),
                "input_norm": S.norm(dim=1).tolist(),
                "perturbation_ratio": [1.1**t for t in range(steps - 20)],
                "standard_distance": list(range(steps)),
            },
            "perturb_at": 20,
            "spectra": [{"step": s, "eigenvalues": eig} for s in (1, 30)],
            "fixed_points": [{"step": 1, "points": [point(5, "stable"), point(40, "saddle")]}],
            "kpass": {"rows": [{"passes": k, "error_to_exact": [10.0 ** -(k + t % 3) for t in range(10)]} for k in (1, 2, 3)]},
        }
        states[name] = S
    return results, states


@pytest.fixture(scope="module")
def dynamics():
    return dynamics_figures(*dynamics_results())


def panels(fig, xlabel_part: str) -> list:
    """The figure's data axes (colour bars are axes too), told apart by their x label."""
    return [ax for ax in fig.axes if xlabel_part in ax.get_xlabel()]


def overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_the_regime_palette_has_one_colour_per_regime_and_the_baseline():
    assert set(REGIME_COLORS) == {*REGIMES, "baseline"}
    assert len(set(REGIME_COLORS.values())) == len(REGIME_COLORS)
    assert regime_color("recurrent") == REGIME_COLORS["fused"]  # a probe sweep's K-pass prefill is the fused regime's
    assert regime_color("standard", "baseline") == REGIME_COLORS["baseline"]
    assert regime_color("standard", "hd") == REGIME_COLORS["standard"]


def test_dynamics_figures_are_the_published_files(dynamics):
    assert tuple(dynamics) == FIGURES


def test_spectra_keep_the_unit_circle_round(dynamics):
    fig = dynamics["spectra.png"]
    fig.draw_without_rendering()
    for ax in panels(fig, "Re"):
        assert ax.get_aspect() == 1.0
        low, high = ax.get_xlim()
        assert ax.get_ylim() == (low, high) and low == -high and high >= 2.5  # square, centred, the far eigenvalue in
        # one data unit spans as many pixels along Re as along Im: the unit circle is drawn round
        origin, re, im = ax.transData.transform([(0, 0), (1, 0), (0, 1)])
        assert re[0] - origin[0] == pytest.approx(im[1] - origin[1], rel=1e-6)
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("Re", "Im")


def test_fixed_point_panels_have_axis_labels_a_step_colour_bar_and_titles_apart(dynamics):
    fig = dynamics["fixed_points.png"]
    main = panels(fig, "principal component 1")
    assert len(main) == 2
    for ax, name in zip(main, NAMES):
        assert ax.get_ylabel() == "principal component 2 of the states"
        assert ax.get_title().split("\n")[0] == name
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["stable", "marginal", "saddle", "unstable"]
    bars = [ax for ax in fig.axes if ax not in main]
    assert [ax.get_ylabel() for ax in bars] == ["rollout step"] * 2
    fig.draw_without_rendering()
    first, second = (ax.title.get_window_extent() for ax in main)
    assert not overlap(first, second)


def test_kpass_ticks_whole_pass_counts(dynamics):
    for ax in panels(dynamics["kpass.png"], "position"):
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert ticks and all(t == int(t) for t in ticks)


def probe_rows(passes=("1", "2", "3", "exact"), layers=(0, 1, 2, 3), streams=(0,)) -> list[dict]:
    return [
        {
            "hook": f"blocks.{layer}.hook_resid_pre",
            "layer": float(layer),
            "prefill": "standard" if k == "1" else "recurrent",
            "passes": 1 if k == "1" else k,
            "stream": s,
            "accuracy": 0.6 + 0.05 * layer,
            "control_accuracy": 0.5,
            "chance": 0.5,
        }
        for k in passes
        for s in streams
        for layer in layers
    ]


def visible_ticks(axis, limits) -> list[float]:
    return [t for t in axis.get_ticklocs() if limits[0] <= t <= limits[1]]


def test_a_probe_figure_of_one_depth_gives_it_a_layer_of_room():
    ax = probe_figure(probe_rows(layers=(0,)), "fbt: probing memory at layer 0", "fbt").axes[0]
    assert ax.get_xlim() == (-0.5, 0.5) and visible_ticks(ax.xaxis, ax.get_xlim()) == [0]


def test_probe_figure_ticks_whole_layers_colours_by_regime_and_tells_probe_from_control():
    ax = probe_figure(probe_rows(), "fbt: probing memory", "fbt").axes[0]
    ticks = visible_ticks(ax.xaxis, ax.get_xlim())
    assert ticks == [0, 1, 2, 3]
    legend = ax.get_legend()
    entries = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles))
    assert list(entries) == [
        "standard",
        "recurrent K=2",
        "recurrent K=3",
        "recurrent K=exact",
        "chance (majority)",
        "probe",
        "control task",
    ]
    probe, control = entries["probe"], entries["control task"]
    assert (probe.get_linestyle(), probe.get_markerfacecolor()) != (control.get_linestyle(), control.get_markerfacecolor())
    assert to_hex(entries["standard"].get_color()) == REGIME_COLORS["standard"]
    recurrent = [entries[f"recurrent K={k}"] for k in ("2", "3", "exact")]
    assert {to_hex(h.get_color()) for h in recurrent} == {REGIME_COLORS["fused"]}
    assert len({h.get_marker() for h in recurrent}) == 3  # one colour: told apart by their markers
    assert (ax.get_xlabel(), ax.get_title()) == ("depth (0 = input to block 0)", "fbt: probing memory")


def test_probe_figure_of_a_baseline_run_takes_the_baseline_colour():
    ax = probe_figure(probe_rows(passes=("1",), streams=(0, 1)), "t", "baseline").axes[0]
    lines = [h for h, t in zip(ax.get_legend().legend_handles, ax.get_legend().get_texts()) if "stream" in t.get_text()]
    assert len(lines) == 2 and {to_hex(h.get_color()) for h in lines} == {REGIME_COLORS["baseline"]}


def trace_rows() -> list[dict]:
    rng = random.Random(0)
    plan = [("fbt", g) for g in ("standard", "soft", "fused")] + [("baseline", "standard"), ("hd2", "standard")]
    return [
        {
            "model": model,
            "regime": regime,
            "problem_id": i,
            "difficulty": 1 + i % 4,
            "trace_tokens": rng.randint(5, 159),
            "correct": rng.random() < 0.5,
            "finished": True,
        }
        for (model, regime), i in itertools.product(plan, range(16))
    ]


def test_traces_figure_names_its_axes_clamps_accuracy_and_leaves_the_reference_out_of_the_differences():
    rows = trace_rows()
    summary = summarise(rows, ("fbt", "soft"))  # a reference that is not the first pair
    lengths, accuracy, differences = traces_figure(rows, summary, {"fbt": "fbt", "baseline": "baseline", "hd2": "hd"}).axes
    assert (lengths.get_xlabel(), lengths.get_ylabel()) == ("trace length (tokens)", "problems")
    for axis, limits in ((lengths.xaxis, lengths.get_xlim()), (lengths.yaxis, lengths.get_ylim())):
        ticks = visible_ticks(axis, limits)
        assert ticks and all(t == int(t) for t in ticks)  # counts: no fractional ticks
    assert accuracy.get_ylim() == (0, 1)
    assert (accuracy.get_xlabel(), accuracy.get_ylabel()) == ("mean trace length (tokens)", "accuracy")
    shown = [t.get_text() for t in differences.get_legend().get_texts()]
    assert sorted(shown) == ["baseline/standard", "fbt/fused", "fbt/standard", "hd2/standard"]
    assert differences.get_ylabel() == "difference in trace length (tokens)"
    assert visible_ticks(differences.xaxis, differences.get_xlim()) == [1, 2, 3, 4]
    colours = {t.get_text(): to_hex(line.get_color()) for t, line in zip(accuracy.get_legend().get_texts(), accuracy.get_lines())}
    assert colours == {
        "baseline/standard": REGIME_COLORS["baseline"],
        "fbt/fused": REGIME_COLORS["fused"],
        "fbt/soft": REGIME_COLORS["soft"],
        "fbt/standard": REGIME_COLORS["standard"],
        "hd2/standard": REGIME_COLORS["standard"],
    }
    styles = {
        t.get_text(): (line.get_linestyle(), line.get_marker())
        for t, line in zip(accuracy.get_legend().get_texts(), accuracy.get_lines())
    }
    assert styles["fbt/standard"] != styles["hd2/standard"]  # one colour, two models: told apart by line and marker


# ---- notebook 01 describes what the plot functions do to matplotlib ------------------------------


@pytest.mark.slow
def test_plot_functions_leave_the_matplotlib_backend_alone(tmp_path):
    import subprocess
    import sys

    script = f"""
import sys, matplotlib
matplotlib.use("svg")
from workbench.probing.study import plot_probe_rows
rows = [dict(prefill="standard", passes=1, stream=0, layer=d, accuracy=0.5, control_accuracy=0.9, chance=0.3) for d in (0, 1)]
plot_probe_rows(rows, __import__("pathlib").Path({str(tmp_path / "p.png")!r}), "t")
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert "matplotlib.pyplot" not in sys.modules
"""
    subprocess.run(
        [sys.executable, "-c", script], check=True, cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    )
    assert (tmp_path / "p.png").stat().st_size > 0
    for path in (ROOT / "workbench").rglob("*.py"):
        text = path.read_text()
        assert "matplotlib.use(" not in text and "pyplot" not in text.replace("no pyplot", ""), path


def test_notebook_01_does_not_claim_the_plot_functions_switch_to_agg():
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "01_layer0_probes.ipynb", as_version=4)
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Agg" not in prose
    assert "pyplot" in prose and "backend" in prose  # it says what they do instead
