"""One colour per decoding regime, for every figure that colours by regime: the studies'
matplotlib figures, the notebooks and the app's charts take them from here, so that a regime reads
the same in a CLI figure, a notebook and the app. A baseline run (one regime, standard) drawn next
to an FBT run's regimes takes the baseline's own colour."""

REGIME_COLORS = {
    "standard": "#1f77b4",
    "soft": "#ff7f0e",
    "fused": "#2ca02c",
    "baseline": "#9467bd",  # not grey: grey is the chance and reference lines
}
# a probe sweep's recurrent (K-pass) prefill is what the fused regime runs on its prompt
PREFILL_REGIME = {"recurrent": "fused"}


def regime_key(regime: str, arch: str | None = None) -> str:
    """The ``REGIME_COLORS`` key of ``regime`` (a decoding regime or a probe sweep's prefill) on a
    run of architecture ``arch``."""
    return "baseline" if arch == "baseline" else PREFILL_REGIME.get(regime, regime)


def regime_color(regime: str, arch: str | None = None) -> str:
    return REGIME_COLORS[regime_key(regime, arch)]
