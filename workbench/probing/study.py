"""The layer-0 state-accessibility study: does recurrent (multi-pass) prefill expose a global state
(the modsum running sum, the flip-flop memory) at the bottom of the stack, where standard prefill
does not? Sweeps hook x prefill regime (x stream for HD) and writes one row per combination.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from workbench.data.splits import heldout_examples
from workbench.data.tasks import LABELS, TaskConfig
from workbench.probing.probes import RANKS, save_probe, train_probe
from workbench.probing.store import cache_activations, hook_names, load_store
from workbench.runtime.checkpoint import load_model
from workbench.runtime.palette import regime_color
from workbench.runtime.tokenizer import tokenizer_of
from workbench.storage.errors import BadInput, NotADirectory, OutputExists
from workbench.storage.files import atomic_write, fsync, read_json, write_json
from workbench.storage.outputs import Output, listing, output
from workbench.storage.provenance import source_commit
from workbench.training.run import RunTask, run_task
from workbench.training.runconfig import task_config

RESULTS = "results"  # the kind of output a directory probe sweeps write into is

MAX_SEQUENCES = 100_000
TARGET_TASK = {label: task for task, labels in LABELS.items() for label in labels}


def default_hooks(n_layers: int) -> list[str]:
    return ["blocks.0.hook_resid_pre", *[f"blocks.{i}.hook_resid_post" for i in range(n_layers)]]


def depth(hook: str) -> float:
    """Position in the stack: resid_pre of block i = i, resid_mid = i + 0.5, resid_post = i + 1."""
    match = re.match(r"blocks\.(\d+)\.hook_resid_(pre|mid|post)$", hook)
    if not match:
        return 0.0 if hook in ("hook_embed", "hook_stream_embed") else float("nan")
    return int(match.group(1)) + {"pre": 0.0, "mid": 0.5, "post": 1.0}[match.group(2)]


def regimes(model, passes: list[int], exact: bool) -> list[tuple[str, int | str]]:
    out: list[tuple[str, int | str]] = [("standard", 1)]
    if "fused" in model.regimes:
        out += [("recurrent", k) for k in passes if k > 1]
        if exact:
            out.append(("recurrent", "exact"))
    return out


N_SEQUENCES = 400  # held-out sequences a probe sweep stores, by default (the CLI's and the app's)


def probe_study(
    run_dir: str | Path,
    target: str | None = None,
    *,
    hooks: list[str] | None = None,
    passes: Sequence[int] = (2, 3),
    exact: bool = True,
    n_sequences: int = N_SEQUENCES,
    seed: int = 0,
    out: str | Path | None = None,
    report_name: str | None = None,
    data: TaskConfig | None = None,
    max_rows: int = 20000,
    overwrite: bool = False,
    progress: Callable[[float, str], None] | None = None,
    mdl: bool = True,
    mdl_hooks: Sequence[str] | None = None,
    ranks: Sequence[int] = RANKS,
    device: str | torch.device = "cpu",
) -> dict:
    """Run the sweep on the model in ``run_dir``; writes ``probe_<target>.json`` (or
    ``report_name``), its figure beside it and the probe weights under ``probes/<target>/``, all in
    the directory ``out`` (default: the run's ``results/``), holding it while it works. A previous
    sweep's outputs are replaced only with ``overwrite``. ``data``: the task settings of the problems
    probed (default: the run's own, from its ``config.json``; recorded in the report). ``progress(fraction,
    what)`` is called before each activation caching and after each probe. ``mdl`` and ``ranks``
    go to ``train_probe``: every row carries the online codelength (``mdl_bits``,
    ``control_mdl_bits``, ``uniform_bits``, ``compression``, ``control_compression``; None with
    ``mdl=False``, or at hooks not in ``mdl_hooks`` where that is given) and the rank sweep
    (``rank_sweep``; empty with ``ranks=()``). ``target``: by
    default the label of the run's own task (``Run.task``); the problems probed are always that
    label's task's held-out problems, and the report's ``input`` says whether they are the run's."""
    own = run_task(run_dir)
    target = target if target is not None else default_target(own)
    if target not in TARGET_TASK:
        raise BadInput(f"unknown probe target {target!r}: expected one of {sorted(TARGET_TASK)}")
    if not 3 <= n_sequences <= MAX_SEQUENCES:
        raise BadInput(f"n_sequences={n_sequences}: expected 3..{MAX_SEQUENCES:,} (train, validation and test split by sequence)")
    run_dir = Path(run_dir)
    model, tokenizer = load_model(run_dir, device=device), tokenizer_of(run_dir)
    hooks = hook_names(model, hooks or default_hooks(model.cfg.n_layers))  # patterns become the names the store has
    described = set(hooks if mdl_hooks is None else hook_names(model, list(mdl_hooks))) if mdl else set()
    task = TARGET_TASK[target]
    source = own.input_record(task, run=run_dir.name)
    results_dir = Path(out) if out is not None else run_dir / "results"
    if results_dir.exists() and not results_dir.is_dir():
        raise NotADirectory(f"{results_dir} is a file: --out takes the directory a probe sweep writes into")
    out = results_dir / (report_name or f"probe_{target}.json")
    probes_dir = results_dir / "probes" / target
    check_probe_outputs(out, probes_dir, overwrite)
    data = data if data is not None else task_config(run_dir)  # the problems the run learned
    examples = heldout_examples(task, n_sequences, seed, data)
    rows = []
    rng = np.random.default_rng(seed)
    sweep = regimes(model, list(passes), exact)
    total, done = len(sweep) * len(hooks) * model.n_streams, 0
    report = progress or (lambda fraction, what: None)
    with output(results_dir, RESULTS) as held:
        check_probe_outputs(out, probes_dir, overwrite)  # again, now that nobody else can write them
        scratch = held.scratch()
        for prefill, k in sweep:
            report(done / total, f"caching activations: {prefill} prefill, K={k}")
            store_dir = cache_activations(
                model, examples, hooks, scratch / f"store-{prefill}-{k}", prefill=prefill, passes=k, tokenizer=tokenizer
            )
            ds, meta = load_store(store_dir, verify=False)  # written just now by this process
            table = ds.select_columns(["seq", "pass", "stream", "token", f"label.{target}"]).with_format("numpy")[:]
            labels = table[f"label.{target}"]
            last_pass = int(table["pass"].max())
            for stream in range(meta["n_streams"]):
                keep = np.flatnonzero((labels >= 0) & (table["pass"] == last_pass) & (table["stream"] == stream))
                if len(keep) > max_rows:
                    keep = np.sort(rng.choice(keep, max_rows, replace=False))
                for hook in hooks:
                    X = ds.select_columns([f"act.{hook}"]).select(keep).with_format("numpy")[:][f"act.{hook}"]
                    # one BLAS thread: these solves are small, and on a shared machine every extra
                    # thread only contends (the sweep ran 10-40x slower with all of them)
                    with threadpool_limits(1, user_api="blas"):
                        result = train_probe(
                            X,
                            labels[keep],
                            table["seq"][keep],
                            table["token"][keep],
                            seed=seed,
                            mdl=hook in described,
                            ranks=ranks,
                        )
                    name = f"{hook}__{prefill}-{k}" + (f"__s{stream}" if meta["n_streams"] > 1 else "")
                    saved = scratch / "probes" / f"{name}.safetensors"
                    save_probe(result, saved, {"hook": hook, "prefill": prefill, "passes": k, "stream": stream, "target": target})
                    rows.append(
                        {
                            "hook": hook,
                            "layer": depth(hook),
                            "prefill": prefill,
                            "passes": k,
                            "stream": stream,
                            "accuracy": result.accuracy,
                            "chance": result.chance,
                            "control_accuracy": result.control_accuracy,
                            "control_chance": result.control_chance,
                            "selectivity": result.selectivity,
                            "n_train": result.n_train,
                            "n_test": result.n_test,
                            "C": result.reg,
                            "converged": result.converged,
                            "mdl_bits": result.mdl_bits,
                            "control_mdl_bits": result.control_mdl_bits,
                            "uniform_bits": result.uniform_bits,
                            "compression": result.compression,
                            "control_compression": result.control_compression,
                            "rank_sweep": result.rank_sweep,
                        }
                    )
                    done += 1
                    report(done / total, f"probed {hook} ({prefill}, K={k}, stream {stream})")
        report = {
            "run": str(run_dir),
            "arch": model.arch,
            "target": target,
            "task": task,
            "input": source,
            "n_sequences": n_sequences,
            "data": dataclasses.asdict(data) if data is not None else None,
            "commit": source_commit(),
            "rows": rows,
        }
        # publish: the previous sweep's weights go (what its manifest lists), the new ones move in
        # whole, then the figure, then the report last
        probes_dir.parent.mkdir(parents=True, exist_ok=True)
        if not held.remove(str(probes_dir.relative_to(results_dir))):
            raise OutputExists(f"{probes_dir} holds files no probe sweep wrote: move them away or choose another --out")
        os.replace(scratch / "probes", probes_dir)
        fsync(probes_dir.parent)
        figure = plot_probe_rows(rows, out.with_suffix(".png"), f"{run_dir.name}: probing {target}", model.arch)
        write_json(out, report)
        held.wrote(probes_dir, figure, out)
    report["figure"] = str(figure)
    return report


def default_target(task: RunTask) -> str:
    """The label a probe of a run on ``task`` targets by default: its task's label; in a mix, the
    flip-flop's stored bit where the mix has it (the state the layer-0 studies probe, as the
    probes study does), else its first task's. ``BadInput`` naming the labels where it has none."""
    if "memory" in task.labels:
        return "memory"
    if task.labels:
        return task.labels[0]
    raise BadInput(
        f"the run's task ({task.name}) carries no per-position labels: give --target, one of {', '.join(sorted(TARGET_TASK))}"
    )


def check_probe_outputs(out: Path, probes_dir: Path, overwrite: bool) -> None:
    """A sweep writes new files, or replaces a previous sweep's with ``overwrite``; never a file it
    did not write: a previous sweep's report, figure and probe weights are the ones the directory's
    manifest (``RESULTS``) lists, and nothing else is among them."""
    results_dir, figure = out.parent, out.with_suffix(".png")
    names = [str(p.relative_to(results_dir)) for p in (out, figure, probes_dir) if p.exists()]
    if not names:
        return
    foreign = Output(results_dir, RESULTS).foreign(names)
    if foreign or not (out.exists() and _is_probe_report(out)):
        raise OutputExists(
            f"{results_dir} holds files that no probe sweep of this workbench wrote ({listing(foreign or names)}): "
            "move them away or choose another --out"
        )
    if not overwrite:
        raise OutputExists(f"{out} holds a previous probe sweep: pass --overwrite to replace it")


def _is_probe_report(path: Path) -> bool:
    try:
        report = read_json(path)
    except (OSError, ValueError):
        return False
    return isinstance(report.get("rows"), list) and "target" in report


MARKERS = "osD^vPX*<>"  # one per line of a probe figure: lines of one regime share its colour


def plot_probe_rows(rows: list[dict], path: Path, title: str, arch: str | None = None) -> Path:
    fig = probe_figure(rows, title, arch)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    return path


def probe_figure(rows: list[dict], title: str, arch: str | None = None):
    """Probe accuracy by depth, one line per prefill regime (and stream), in the regime's colour
    (``palette``; ``arch`` 'baseline': the baseline's); the control task dotted with open markers."""
    from matplotlib.figure import Figure  # no pyplot: the global backend (e.g. a notebook's inline one) stays as it is
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    keys = sorted({(r["prefill"], str(r["passes"]), r["stream"]) for r in rows}, key=lambda key: (key[0] != "standard", key))
    for (prefill, k, stream), marker in zip(keys, itertools.cycle(MARKERS)):
        sel = sorted(
            (r for r in rows if (r["prefill"], str(r["passes"]), r["stream"]) == (prefill, k, stream)), key=lambda r: r["layer"]
        )
        label = prefill if prefill == "standard" else f"recurrent K={k}"
        if len({r["stream"] for r in rows}) > 1:
            label += f" stream {stream}"
        color = regime_color(prefill, arch)
        depths = [r["layer"] for r in sel]
        ax.plot(depths, [r["accuracy"] for r in sel], marker=marker, color=color, label=label)
        ax.plot(depths, [r["control_accuracy"] for r in sel], ls=":", marker=marker, mfc="none", color=color, alpha=0.6)
    ax.axhline(rows[0]["chance"], color="grey", ls="--", label="chance (majority)")
    depths = [r["layer"] for r in rows]
    ax.set_xlim(min(depths) - 0.5, max(depths) + 0.5)  # one depth alone would get matplotlib's +-0.05 around it
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # depths are layer boundaries
    ax.set_xlabel("depth (0 = input to block 0)")
    ax.set_ylabel("probe accuracy (dotted: control task)")
    ax.set_title(title)
    handles, _ = ax.get_legend_handles_labels()
    # what tells a probe from its control task, as legend entries of their own
    handles += [
        Line2D([], [], color="black", marker="o", label="probe"),
        Line2D([], [], color="black", ls=":", marker="o", mfc="none", label="control task"),
    ]
    ax.legend(handles=handles, fontsize=8)
    fig.tight_layout()
    return fig
