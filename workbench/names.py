"""The names the command line offers as choices, in one module that imports nothing: building the
parser (``workbench --help``) never loads torch, and the library modules that use a name read it here."""

# Names that key a table of settings elsewhere, or that models/ defines (it imports nothing from
# workbench/): tests/workbench/test_names.py keeps each the same as that table's keys.
PRESETS = ("debug", "tiny", "small", "gpu")  # the model sizes, models.presets.PRESETS
ARCHS = ("baseline", "fbt", "hd")  # workbench.runtime.config.ARCHS
REGIMES = ("standard", "soft", "fused")  # the decoding regimes, models' FullBandwidthLM.regimes
SAE_ARCHITECTURES = ("topk", "batchtopk")  # workbench.probing.sae.ARCHITECTURES
ZOO_SCALES = ("micro", "quick", "org-flipflop", "org-perm", "org-addition", "cpu")  # workbench.training.zoo.SCALES
FAIR_SCALES = ("micro", "modsum", "flipflop", "org-flipflop", "org-perm", "org-addition")  # fbt_vs_baseline.SCALES

# How a decode step runs (workbench.runtime.decoding): "eager" on a growing key/value cache (the
# reference and the default: uncompiled, it measured as fast as "static" or faster), "static" on
# fixed-size buffers with fixed shapes, "compiled" the static step through torch.compile (the first
# call per model and shape compiles, tens of seconds on a CPU; steps with hooks attached run eagerly).
ENGINES = ("eager", "static", "compiled")
PREFILLS = ("standard", "recurrent")  # how an activation store's prompts are read (workbench.probing.store)
DTYPES = {"fp32": None, "bf16": "bfloat16"}  # --dtype: the torch dtype each name means (None: as saved)

ALL_ORGANISMS = "organisms"  # the zoo preset that trains every organism's zoo
ZOO_PRESETS = (*ZOO_SCALES, ALL_ORGANISMS, *(scale for scale in FAIR_SCALES if scale not in ZOO_SCALES))
COMPARISON_STUDIES = (
    "data-efficiency",
    "three-pass",
    "hd-ablations",
    "probes",
    "traces",
    "stability",
)  # experiments.studies.STUDIES
FAIR_STUDY = "fbt-vs-baseline"  # experiments.fbt_vs_baseline
STUDIES = (*COMPARISON_STUDIES, FAIR_STUDY)  # workbench zoo --study
