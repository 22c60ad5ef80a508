"""The benchmark page: the speed ratios ``workbench bench`` measured (``bench_small.json``, and
``bench_tiny.json`` and ``bench_smollm2.json`` where they were measured), a table per file: each
ratio with its spread, its target and whether it met it, and what was timed."""

from __future__ import annotations

from pathlib import Path

from .render import Page, named, sci, table


def bench_ratio(entry: dict) -> str:
    ratio = entry["ratio"]
    if ratio is None:  # a key not measured where the bench ran; entry["skipped"] says why
        return "skipped"
    if entry.get("unit"):
        return f"{ratio:.0f} {entry['unit']}"
    return f"{ratio:.3f}" if abs(ratio - 1) < 0.1 else f"{ratio:.3g}"


def bench_target(entry: dict) -> str:
    target = entry.get("target")
    if target is None:
        return "reported"
    if entry.get("unit"):
        op, _, value = target.partition(" ")
        return f"{op} {float(value):g} {entry['unit']}"
    return target


def bench_what(entry: dict, reps: int | None) -> str:
    if entry.get("skipped"):
        return entry["skipped"]
    if "a" in entry and "b" in entry:
        a, b = entry["a"], entry["b"]
        if "achieved_gflops" in entry:
            what = f"{entry['achieved_gflops']:.0f} GFLOP/s {b['what']} vs {entry['matmul_gflops']:.0f} GFLOP/s {a['what']}"
        else:
            what = f"{b['what']} / {a['what']} ({b['median_s']:#.3g} s vs {a['median_s']:#.3g} s)"
    elif isinstance(entry.get("runs"), list):  # one process per size: peak memory at each
        what = " vs ".join(f"{run['peak_rss_mib']:.0f} MiB at {run['tokens']:,} tokens" for run in reversed(entry["runs"]))
    else:
        what = ", ".join(
            text.format(entry[key]) for key, text in (("positions", "{:,} positions"), ("seconds", "{:g} s")) if key in entry
        )
    extras = [entry["note"]] if entry.get("note") else []
    if "same_tokens" in entry:
        extras.append(f"same tokens: {'yes' if entry['same_tokens'] else '**no**'}")
    if "max_abs_logit_diff" in entry:
        extras.append(f"max abs logit difference {sci(entry['max_abs_logit_diff'])}")
    for other in ("eager", "static", "compiled"):  # the same pair on another decoding engine, timed in the same interleave
        if isinstance(entry.get(other), dict) and "ratio" in entry[other]:
            extras.append(f"{other} engine: {bench_ratio(entry[other])}")
    if entry.get("reps") not in (None, reps):
        extras.append(f"{entry['reps']} pairs")
    return "; ".join([what] + extras)


def bench_table(bench: dict) -> str:
    rows = []
    for entry in bench["entries"]:
        spread = entry.get("spread")
        met = {True: "yes", False: "**no**", None: ""}[entry.get("met")]
        rows.append(
            [
                f"`{entry['key']}`",
                bench_ratio(entry),
                f"{spread[0]:.2f}-{spread[1]:.2f}" if spread else "",
                bench_target(entry),
                met,
                bench_what(entry, bench.get("reps")),
            ]
        )
    return table(["key", "ratio (median)", "spread", "target", "met", "what was timed (numerator / denominator)"], rows)


BENCH_HEADINGS = {"bench_smollm2.json": "Pretrained SmolLM2-135M-Instruct against transformers and TransformerBridge"}
BENCHES = ("bench_small.json", "bench_tiny.json", "bench_smollm2.json")  # bench_small.json always; the others where measured


def bench_body(benches: list[tuple[str, dict]]) -> list[str]:
    body = []
    for name, bench in benches:
        body += [
            f"## {BENCH_HEADINGS.get(name, 'Ratios')}, `{bench.get('preset', '?')}` preset",
            "",
            "Each pair timed interleaved in one process; ratio = median of the per-pair ratios, spread = their",
            f"min and max; {bench.get('reps')} pairs unless the row says otherwise.",
            "",
            bench_table(bench),
            "",
        ]
    return body


def bench_title(*benches: dict) -> str:
    shown_presets = list(dict.fromkeys(f"`{bench.get('preset', '?')}`" for bench in benches))
    presets = " and ".join(shown_presets)
    return f"Benchmarks, {presets} presets (measured)" if len(shown_presets) > 1 else f"Benchmarks, {presets} preset (measured)"


def bench(results: Path) -> Page:
    """The page of the benches measured: bench_small.json, and each other one whose JSON is in ``results``."""
    names = tuple(name for name in BENCHES if name == "bench_small.json" or (results / name).is_file())
    return Page(names, bench_title, named(names, bench_body), figures=names)
