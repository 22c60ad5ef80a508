"""Dynamics: the FBT feedback map and rollouts (``feedback``), estimators on maps (``maps``), and
the study that runs them on a trained model (``study``)."""
