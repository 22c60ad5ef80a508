"""Experiments: the comparisons across training seeds that the seed papers' claims are read from,
in one place.

- ``studies``: the studies of ``workbench zoo --study`` (data efficiency, three-pass, HD's
  ablations, layer-0 probes, traces), a plugin each in one registry: its members, its readings
  across seeds, its declared family of comparisons and its readings table;
- ``comparisons``: their runner (train every member at every seed, measure, Holm-correct the
  family) and the tables the app shows;
- ``fbt_vs_baseline``: FBT against the baseline, fair by construction (a tuning sweep per
  architecture by a rule fixed in advance, matched initialisation, per-problem scores);
- ``seed_readings``: the probes, dynamics and traces of a zoo read across its seeds;
- ``claims``: each claim, the study and comparison that test it, and its verdict.

The statistics they rest on (paired and crossed intervals, Holm, the reading rule) are
``workbench.training.stats`` and ``workbench.training.intervals``, which the zoo uses too.
"""
