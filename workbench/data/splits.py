"""Held-out data: the problems every study evaluates on, never the ones a run trained on."""

EVAL_SEED_OFFSET = 10_000  # validation problems never share the training seed
