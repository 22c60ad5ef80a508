"""The app's Altair charts (``app/charts.py``) as Vega-Lite specs: axis titles, scale domains,
encodings and legends, on small frames shaped like what the pages draw."""

import math

import pandas as pd
import pytest

pytest.importorskip("altair")
from app import charts  # noqa: E402
from workbench.runtime.palette import REGIME_COLORS  # noqa: E402


def legends(spec) -> list[dict]:
    """Every legend set anywhere in a spec (layers, facets)."""
    if isinstance(spec, dict):
        own = [spec["legend"]] if isinstance(spec.get("legend"), dict) else []
        return own + [lg for v in spec.values() for lg in legends(v)]
    if isinstance(spec, list):
        return [lg for v in spec for lg in legends(v)]
    return []


def values(spec: dict) -> list[dict]:
    [data] = spec["datasets"].values()
    return data


def probe_rows(passes=("1", "2", "exact"), layers=(0, 1, 2, 3), streams=(0,)) -> pd.DataFrame:
    """The Probes page's frame: one row per hook, prefill, K and stream, with its ``regime`` label."""
    rows = pd.DataFrame(
        [
            {
                "hook": f"blocks.{layer}.hook_resid_pre",
                "layer": float(layer),
                "prefill": "standard" if k == "1" else "recurrent",
                "passes": k,
                "stream": s,
                "accuracy": 0.6 + 0.05 * layer,
                "control_accuracy": 0.5,
                "chance": 0.5,
                "n_test": 40,
            }
            for k in passes
            for s in streams
            for layer in layers
        ]
    )
    rows["regime"] = [p if p == "standard" else f"recurrent K={k}" for p, k in zip(rows["prefill"], rows["passes"])]
    if rows["stream"].nunique() > 1:
        rows["regime"] = rows["regime"] + " / stream " + rows["stream"].astype(str)
    return rows


def trace_rows() -> pd.DataFrame:
    rows = pd.DataFrame(
        [
            {
                "model": m,
                "regime": g,
                "problem_id": i,
                "difficulty": 1 + i % 2,
                "trace_tokens": 100 + 7 * i,
                "correct": i % 3 == 0,
            }
            for m, regimes in (("fbt", ("standard", "soft", "fused")), ("a-long-baseline-name-seed0", ("standard",)))
            for g in regimes
            for i in range(6)
        ]
    )
    rows["run"] = rows["model"] + "/" + rows["regime"]
    return rows


ARCHS = {"fbt": "fbt", "a-long-baseline-name-seed0": "baseline"}


def test_hd_stage_losses_draw_a_stage_that_logged_once_as_a_point():
    # the micro zoo: each HD expansion stage logs one point; a line alone draws nothing for it
    wide = pd.DataFrame({"loss (n=2 streams)": [3.1, math.nan], "loss (n=4 streams)": [math.nan, 2.9]}, index=[5, 10])
    spec = charts.stage_losses(wide).to_dict()
    assert spec["mark"] == {"type": "line", "point": True}
    assert [(v["stage"], v["step"], v["loss"]) for v in values(spec)] == [
        ("loss (n=2 streams)", 5, 3.1),
        ("loss (n=4 streams)", 10, 2.9),
    ]
    enc = spec["encoding"]
    assert (enc["x"]["field"], enc["x"]["title"], enc["y"]["title"]) == ("step", "step", "loss")
    assert enc["color"]["sort"] == ["loss (n=2 streams)", "loss (n=4 streams)"]


def test_probe_depths_tick_whole_layers_and_tell_probe_from_control_in_the_legend():
    rows = probe_rows(layers=(0, 1, 2, 3))
    rows.loc[rows["layer"] == 1.0, "layer"] = 1.5  # a resid_mid hook sits between layers; ticks stay whole
    spec = charts.probe_depths(rows, "fbt").to_dict()
    lines, points, chance = spec["layer"]
    x = lines["encoding"]["x"]
    assert x["axis"]["values"] == [0, 1, 2, 3] and x["axis"]["format"] == "d"
    assert x["title"] == "depth (0 = input to block 0)"
    dash = lines["encoding"]["strokeDash"]
    assert dash["scale"]["domain"] == ["probe", "control task"]
    assert dash["scale"]["range"][0] != dash["scale"]["range"][1]
    assert dash["legend"]["symbolType"] == "stroke"  # drawn as a solid and a dashed line, not two alike circles
    color, shape = lines["encoding"]["color"], points["encoding"]["shape"]
    assert color["scale"]["domain"] == shape["scale"]["domain"] == ["standard", "recurrent K=2", "recurrent K=exact"]
    assert color["scale"]["range"] == [REGIME_COLORS["standard"], REGIME_COLORS["fused"], REGIME_COLORS["fused"]]
    assert len(set(shape["scale"]["range"])) == 3  # the two recurrent lines share a colour, not a shape
    assert chance["mark"]["type"] == "rule"


def test_probe_depths_colour_a_baseline_run_as_the_baseline():
    spec = charts.probe_depths(probe_rows(passes=("1",)), "baseline").to_dict()
    assert spec["layer"][0]["encoding"]["color"]["scale"]["range"] == [REGIME_COLORS["baseline"]]


def test_trace_histogram_titles_its_axes_and_colours_by_regime():
    spec = charts.trace_histogram(trace_rows(), "trace_tokens", "tokens", ARCHS).to_dict()
    enc = spec["spec"]["encoding"]
    assert enc["x"]["title"].startswith("trace length (tokens before ####)") and enc["x"]["type"] == "ordinal"
    assert enc["y"]["title"] == "problems" and enc["y"]["axis"] == {"format": "d", "tickMinStep": 1}
    assert enc["xOffset"]["field"] == "regime_key"  # each regime's bar beside the others', none hidden behind one
    assert enc["color"]["scale"] == {
        "domain": ["standard", "soft", "fused", "baseline"],
        "range": [REGIME_COLORS[k] for k in ("standard", "soft", "fused", "baseline")],
    }
    assert spec["facet"]["row"]["field"] == "model"  # models that share a regime's colour get panels of their own


def test_accuracy_by_length_stays_in_zero_one_and_names_its_axes():
    rows = trace_rows()
    by_d = rows.groupby(["model", "regime", "run", "difficulty"]).agg(
        mean_trace=("trace_tokens", "mean"), accuracy=("correct", "mean")
    )
    spec = charts.accuracy_by_length(by_d.reset_index(), "characters", ARCHS).to_dict()
    enc = spec["encoding"]
    assert enc["y"]["scale"] == {"domain": [0, 1], "clamp": True} and enc["y"]["title"] == "accuracy"
    assert enc["x"]["title"] == "mean trace length (characters)" and enc["x"]["axis"]["format"] == ",.0f"
    assert enc["color"]["scale"]["domain"] == ["standard", "soft", "fused", "baseline"]
    assert enc["strokeDash"]["field"] == "model" and enc["strokeDash"]["legend"]["symbolType"] == "stroke"
    formats = {t["field"]: t.get("format") for t in enc["tooltip"]}
    assert formats["mean_trace"] == ".1f" and formats["accuracy"] == ".2f"  # not 159.000000


def test_stream_similarity_colours_the_whole_cosine_range():
    sim = pd.DataFrame([{"stream": i, "other": j, "cosine": 0.96 + 0.01 * (i == j)} for i in range(4) for j in range(4)])
    scale = charts.similarity_heatmap(sim).to_dict()["encoding"]["color"]["scale"]
    assert scale["domain"] == [-1, 1]  # not the data's 0.96..0.97


def test_latent_densities_are_drawn_densest_first():
    latents = pd.DataFrame({"latent": [3, 7, 1], "density": [0.2, 0.6, 0.1]})
    x = charts.latent_densities(latents).to_dict()["encoding"]["x"]
    assert x["sort"] == {"field": "density", "order": "descending"} and x["type"] == "ordinal"


def test_state_norms_title_what_each_architecture_shows_and_colour_by_regime():
    def out(regime, scale=1.0, ablate=None):
        return {"regime": regime, "state_norm": [1.0, 2.0], "intervention": {"state_scale": scale, "ablate_stream": ablate}}

    fbt = charts.state_norms([out("standard"), out("soft", 0.0), out("soft")], "fbt").to_dict()
    assert fbt["title"].startswith("Carried-state norm")
    assert fbt["encoding"]["color"]["scale"]["domain"] == ["standard", "soft"]
    assert sorted({v["run"] for v in values(fbt)}) == ["as is", "state × 0.0"]
    hd = charts.state_norms([out("standard"), out("standard", ablate=1)], "hd").to_dict()
    assert "carried" not in hd["title"].lower() and "read-out stream" in hd["title"]
    assert sorted({v["run"] for v in values(hd)}) == ["as is", "stream 1 ablated"]


def test_member_accuracy_takes_the_regime_palette():
    shown = pd.DataFrame(
        [
            {"member": m, "regime": g, "accuracy": 0.5, "low": 0.4, "high": 0.6}
            for m in ("baseline", "fbt")
            for g in ("fused", "standard")
        ]
    )
    color = charts.member_accuracy(shown, "chain").to_dict()["layer"][0]["encoding"]["color"]
    assert color["scale"] == {"domain": ["standard", "fused"], "range": [REGIME_COLORS["standard"], REGIME_COLORS["fused"]]}


def every_chart() -> list:
    """One of each of the app's charts, on small frames."""
    rows = trace_rows()
    by_d = rows.groupby(["model", "regime", "run", "difficulty"]).agg(
        mean_trace=("trace_tokens", "mean"), accuracy=("correct", "mean")
    )
    mass = pd.DataFrame([{"block": 0, "where": "other_stream_earlier_tokens", "mass": 1.0}])
    built = [
        charts.stage_losses(pd.DataFrame({"loss (n=2 streams)": [3.0]}, index=[1])),
        charts.probe_depths(probe_rows(streams=(0, 1, 2)), "hd"),
        charts.trace_histogram(rows, "trace_tokens", "tokens", ARCHS),
        charts.accuracy_by_length(by_d.reset_index(), "tokens", ARCHS),
        charts.attention_mass_bars(mass),
        charts.similarity_heatmap(pd.DataFrame([{"stream": 0, "other": 0, "cosine": 1.0}])),
        charts.member_accuracy(
            pd.DataFrame([{"member": "fbt", "regime": "soft", "accuracy": 0.5, "low": 0.4, "high": 0.6}]), "chain"
        ),
        charts.state_norms(
            [{"regime": "soft", "state_norm": [1.0], "intervention": {"state_scale": 1.0, "ablate_stream": None}}], "fbt"
        ),
    ]
    return built


def test_no_legend_cuts_its_labels_short():
    for chart in every_chart():
        found = legends(chart.to_dict())
        assert found and all(lg["labelLimit"] == 0 for lg in found), found


def y_titles(spec) -> list[str]:
    """Every y-axis title anywhere in a spec (layers, facets)."""
    if isinstance(spec, dict):
        y = spec.get("encoding", {}).get("y", {})
        own = [y["title"]] if isinstance(y, dict) and isinstance(y.get("title"), str) else []
        return own + [t for v in spec.values() for t in y_titles(v)]
    if isinstance(spec, list):
        return [t for v in spec for t in y_titles(v)]
    return []


def test_every_y_axis_title_reads_when_rotated():
    """The Playground's norm axis was titled '||h||', which Vega draws rotated a quarter
    turn: four bars and an h on their side, an unreadable glyph. A y title is words."""
    titles = [t for chart in every_chart() for t in y_titles(chart.to_dict())]
    assert len(titles) >= 8
    assert all(t.strip() and "|" not in t for t in titles), titles
