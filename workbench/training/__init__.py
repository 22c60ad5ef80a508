"""Training: run configs, the one training loop and its strategies, evaluation, the reference zoo."""
