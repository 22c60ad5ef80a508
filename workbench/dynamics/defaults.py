"""The dynamics analysis's settings by default: one set for ``analyse_run``, the CLI's ``workbench
dynamics`` and the app's Dynamics page, so that the three give the same readings for the same run.
Short enough to run while a researcher waits (a 300-step rollout, four spectra, one fixed-point
search of eight starts); the studies and the documented commands pass their own. Free of torch, so
the CLI's parser reads it."""

DEFAULTS = {
    "horizon": 300,
    "perturb_at": 20,
    "n_spectra": 4,
    "n_fixed": 1,
    "n_starts": 8,
    "max_passes": 8,
    "fp_steps": 50,
    "tangents": 4,
}
