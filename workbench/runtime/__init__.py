"""Runtime: building models from configs, checkpoints, tokenizers, decoding, activation recording,
export. Imports ``storage`` only."""
