"""``workbench bench``: speed as ratios of two measurements taken side by side in one process.

Each entry times A and B interleaved (A B A B ...) after one warm-up of each, at least 5 pairs,
and reports both medians, the median of the per-pair ratios, and their spread (min, max). Shared,
noisy machines shift both sides of a pair alike; an absolute time on CPU means little.

Decode entries say which engine (``workbench.runtime.decoding.ENGINES``) each side ran. The decode
keys with targets run ``ENGINE`` (compiled) on both sides and carry the eager engine's figure,
timed in the same interleave, under ``eager``. Every key that compiles starts from an empty
compile cache (``torch.compiler.reset``), so a key measures alike alone (``--only``) or in the
suite; its warm-up compiles, and ``compiles_in_reps`` counts compiles that landed in the timed
repetitions anyway (0 unless shapes changed) and ``compile_fallbacks`` the steps that fell back
to eager code at dynamo's recompile limit.
"""

from workbench.bench.decode import eos_at_varying_steps, projection_stacks, vs_hf_generate
from workbench.bench.suite import SIZES, machine, run_bench
from workbench.bench.timing import ENGINE, TARGETS, entry, measure, paired
from workbench.training.flops import train_flops_per_token

__all__ = [
    "ENGINE",
    "SIZES",
    "TARGETS",
    "entry",
    "eos_at_varying_steps",
    "machine",
    "measure",
    "paired",
    "projection_stacks",
    "run_bench",
    "train_flops_per_token",
    "vs_hf_generate",
]
