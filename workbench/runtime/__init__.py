"""Runtime: building models from configs, checkpoints, tokenizers, decoding, activation recording,
export, and the regimes' figure colours (``palette``). Imports ``storage`` only."""
