"""Probing: the activation store, linear probes, and the probe study over layers, passes and regimes."""
