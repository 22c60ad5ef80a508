"""The pages' Altair charts, as pure functions of the data they draw (no Streamlit here): a page
reads or computes its results, calls one of these and hands the chart to ``st.altair_chart``.
Regime colours come from ``workbench.runtime.palette``, the same as the CLI's and the notebooks'
figures; legends never cut their labels short (Vega-Lite's default cuts them at 160 pixels, which
long run names exceed)."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from workbench.runtime.palette import REGIME_COLORS, regime_color, regime_key

SHAPES = ["circle", "square", "diamond", "triangle-up", "triangle-down", "cross", "triangle-left", "triangle-right"]
DASHES = {"probe": [1, 0], "control task": [4, 3]}


def legend(title: str | None = None, **kwargs) -> alt.Legend:
    return alt.Legend(title=title, labelLimit=0, **kwargs)


def dash_legend(title: str | None = None) -> alt.Legend:
    """A legend of line styles drawn as lines: its default symbols are circles, all alike."""
    return legend(title, symbolType="stroke", symbolStrokeWidth=2, symbolSize=300)


def regime_scale(keys) -> alt.Scale:
    """The palette's colours for the ``REGIME_COLORS`` keys among ``keys``, in the palette's order."""
    present = [k for k in REGIME_COLORS if k in set(keys)]
    return alt.Scale(domain=present, range=[REGIME_COLORS[k] for k in present])


def stage_losses(wide: pd.DataFrame) -> alt.Chart:
    """Runs page, HD: the training loss by step, one line per expansion stage (``wide``: index
    step, one column per stage). Points on the lines: a stage that logged once is one point, which
    a line alone does not draw."""
    long = wide.rename_axis("step").reset_index().melt("step", var_name="stage", value_name="loss").dropna()
    return (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=alt.X("step:Q", title="step", axis=alt.Axis(format="d")),
            y=alt.Y("loss:Q", title="loss", scale=alt.Scale(zero=False)),
            color=alt.Color("stage:N", sort=list(wide.columns), legend=legend("stage")),
            tooltip=["stage", "step", alt.Tooltip("loss:Q", format=".4f")],
        )
    )


def probe_depths(rows: pd.DataFrame, arch: str | None = None) -> alt.LayerChart:
    """Probes page: accuracy by depth, one line per ``regime`` label (prefill, K, stream) in its
    prefill's colour (``arch`` 'baseline': the baseline's) with a shape of its own; the control task
    dashed; chance as a grey rule. Depth ticks are whole layers."""
    long = pd.concat(
        [rows.assign(kind="probe", value=rows["accuracy"]), rows.assign(kind="control task", value=rows["control_accuracy"])]
    )
    first = rows.drop_duplicates("regime")
    labels = list(first["regime"])
    colors = alt.Scale(domain=labels, range=[regime_color(p, arch) for p in first["prefill"]])
    shapes = alt.Scale(domain=labels, range=[SHAPES[i % len(SHAPES)] for i in range(len(labels))])
    depths = rows["layer"].dropna().tolist()
    ticks = list(range(math.floor(min(depths)), math.ceil(max(depths)) + 1)) if depths else []
    base = alt.Chart(long).encode(
        x=alt.X(
            "layer:Q",
            title="depth (0 = input to block 0)",
            axis=alt.Axis(values=ticks, format="d"),
            # half a layer of room each side: one depth alone gets a domain of its own width, not +-0.05
            scale=alt.Scale(domain=[min(depths) - 0.5, max(depths) + 0.5]) if depths else alt.Undefined,
        ),
        y=alt.Y("value:Q", title="accuracy", scale=alt.Scale(zero=False)),
        tooltip=["hook", "regime", "kind", alt.Tooltip("value:Q", format=".3f"), "n_test"],
    )
    # colour and shape on one field with one title: Vega-Lite draws them as one legend
    lines = base.mark_line().encode(
        color=alt.Color("regime:N", scale=colors, legend=legend("prefill")),
        strokeDash=alt.StrokeDash(
            "kind:N", scale=alt.Scale(domain=list(DASHES), range=list(DASHES.values())), legend=dash_legend("")
        ),
        detail="kind:N",
    )
    points = base.mark_point(filled=True, size=50).encode(
        color=alt.Color("regime:N", scale=colors, legend=legend("prefill")),
        shape=alt.Shape("regime:N", scale=shapes, legend=legend("prefill")),
    )
    chance = (
        alt.Chart(pd.DataFrame({"chance": [rows["chance"].iloc[0]]}))
        .mark_rule(color="grey", strokeDash=[4, 4])
        .encode(y="chance:Q")
    )
    return alt.LayerChart(layer=[lines, points, chance])


def _with_regime_keys(df: pd.DataFrame, archs: dict[str, str]) -> pd.DataFrame:
    return df.assign(regime_key=[regime_key(g, archs.get(m)) for m, g in zip(df["model"], df["regime"])])


def trace_histogram(view: pd.DataFrame, length: str, unit: str, archs: dict[str, str]) -> alt.FacetChart:
    """Traces page: trace lengths (column ``length``, in ``unit``) in at most 30 bins of whole
    lengths, one panel per model, each regime's bar beside the others' in its colour (overlaid
    bars hid a regime whose counts another's covered; ``archs``: model name -> architecture; a
    baseline model takes the baseline's). Each bar is labelled by its bin's first length."""
    data = _with_regime_keys(view.filter(items=["model", "regime", length]), archs)
    lengths = data[length].astype(int)
    low = int(lengths.min()) if len(lengths) else 0
    width = max(1, math.ceil((int(lengths.max()) - low + 1) / 30)) if len(lengths) else 1
    data = data.assign(bin=low + (lengths - low) // width * width)
    counts = data.groupby(["model", "regime_key", "bin"]).size().rename("problems").reset_index()
    title = f"trace length ({unit} before ####)" + (f", bins of {width}" if width > 1 else "")
    return (
        alt.Chart(counts)
        .mark_bar()
        .encode(
            x=alt.X("bin:O", title=title, sort="ascending", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
            xOffset=alt.XOffset("regime_key:N", scale=alt.Scale(domain=list(regime_scale(counts["regime_key"]).domain))),
            y=alt.Y("problems:Q", title="problems", axis=alt.Axis(format="d", tickMinStep=1)),
            color=alt.Color("regime_key:N", scale=regime_scale(counts["regime_key"]), legend=legend("regime")),
            tooltip=[
                "model",
                alt.Tooltip("regime_key:N", title="regime"),
                alt.Tooltip("bin:O", title=f"from ({unit})"),
                "problems",
            ],
        )
        .properties(height=110)
        .facet(row=alt.Row("model:N", title=None))
    )


def accuracy_by_length(by_d: pd.DataFrame, unit: str, archs: dict[str, str]) -> alt.Chart:
    """Traces page: accuracy against mean trace length (in ``unit``), one point per difficulty and
    one line per model and regime: colour the regime's, dashes the model's."""
    data = _with_regime_keys(by_d, archs)
    return (
        alt.Chart(data)
        .mark_line(point=True)
        .encode(
            x=alt.X("mean_trace:Q", title=f"mean trace length ({unit})", axis=alt.Axis(format=",.0f", tickMinStep=1)),
            y=alt.Y("accuracy:Q", title="accuracy", scale=alt.Scale(domain=[0, 1], clamp=True)),
            color=alt.Color("regime_key:N", scale=regime_scale(data["regime_key"]), legend=legend("regime")),
            strokeDash=alt.StrokeDash("model:N", legend=dash_legend("model")),
            detail="run:N",
            tooltip=[
                "run",
                "difficulty",
                alt.Tooltip("mean_trace:Q", format=".1f", title=f"mean trace ({unit})"),
                alt.Tooltip("accuracy:Q", format=".2f"),
            ],
        )
    )


def similarity_heatmap(sim: pd.DataFrame) -> alt.Chart:
    """Streams page: stream-to-stream cosine similarity on its whole range [-1, 1], so that
    near-copies (cosine ~1) look alike; a data-range scale made 0.96 and 1.00 its two extremes."""
    return (
        alt.Chart(sim)
        .mark_rect()
        .encode(
            x=alt.X("other:O", title="stream"),
            y=alt.Y("stream:O", title="stream"),
            color=alt.Color("cosine:Q", scale=alt.Scale(scheme="viridis", domain=[-1, 1]), legend=legend("cosine")),
            tooltip=["stream", "other", alt.Tooltip("cosine:Q", format=".4f")],
        )
        .properties(height=260)
    )


def attention_mass_bars(mass: pd.DataFrame) -> alt.Chart:
    """Streams page: attention mass per block, stacked by where it goes."""
    return (
        alt.Chart(mass)
        .mark_bar()
        .encode(
            x=alt.X("block:O", title="block"),
            y=alt.Y("mass:Q", stack="zero", title="attention mass"),
            color=alt.Color("where:N", legend=legend("where")),
        )
    )


def latent_densities(latents: pd.DataFrame) -> alt.Chart:
    """Sparse autoencoders page: each live latent's density (the fraction of held-out rows it fires
    on), densest first; the bars' order is the table's below it."""
    return (
        alt.Chart(latents)
        .mark_bar()
        .encode(
            x=alt.X("latent:O", sort=alt.EncodingSortField("density", order="descending"), title="latent, densest first"),
            y=alt.Y("density:Q", title="fraction of rows"),
            tooltip=["latent", alt.Tooltip("density:Q", format=".4f")],
        )
        .properties(height=200)
    )


def state_norm_title(arch: str) -> str:
    """What the Playground's norm chart shows: only FBT carries its state to the next step."""
    if arch == "fbt":
        return "Carried-state norm ||h|| per generated token (standard: the same final state, not fed back)"
    if arch == "hd":
        return "Final-state norm of the read-out stream per generated token"
    return "Final-state norm per generated token"


def state_norms(outs: list[dict], arch: str) -> alt.Chart:
    """Playground: the state norm of each generated token (``inspect_generation``'s outputs), one
    line per regime in its colour, dashed where an intervention was applied."""
    data = pd.DataFrame(
        [
            {"token": i, "norm": norm, "regime": o["regime"], "run": intervention_label(o["intervention"]) or "as is"}
            for o in outs
            for i, norm in enumerate(o["state_norm"])
        ]
    )
    data["regime_key"] = [regime_key(g, arch) for g in data["regime"]]
    return (
        alt.Chart(data, title=state_norm_title(arch))
        .mark_line()
        .encode(
            x=alt.X("token:Q", title="generated token", axis=alt.Axis(format="d", tickMinStep=1)),
            y=alt.Y("norm:Q", title="state norm"),
            color=alt.Color("regime_key:N", scale=regime_scale(data["regime_key"]), legend=legend("regime")),
            strokeDash=alt.StrokeDash("run:N", legend=dash_legend("intervention")),
            detail="regime:N",
            tooltip=["regime", "run", "token", alt.Tooltip("norm:Q", format=".3f")],
        )
        .properties(height=220)
    )


def intervention_label(iv: dict) -> str:
    """An ``inspect_generation`` output's intervention in words ('' for none)."""
    if iv["ablate_stream"] is not None:
        return f"stream {iv['ablate_stream']} ablated"
    return "" if iv["state_scale"] == 1.0 else f"state × {iv['state_scale']}"


def member_accuracy(shown: pd.DataFrame, task: str) -> alt.LayerChart:
    """Zoo page: each member's accuracy on ``task`` by regime, with its interval (``low``, ``high``)."""
    base = alt.Chart(shown).encode(
        x=alt.X("member:N", title="member"),
        xOffset=alt.XOffset("regime:N"),
        color=alt.Color("regime:N", scale=regime_scale(shown["regime"]), legend=legend("regime")),
    )
    points = base.mark_point(filled=True, size=60).encode(
        y=alt.Y("accuracy:Q", title=f"{task} accuracy (held-out)", scale=alt.Scale(domain=[0, 1]))
    )
    return alt.LayerChart(layer=[points, base.mark_rule().encode(y="low:Q", y2="high:Q")])
