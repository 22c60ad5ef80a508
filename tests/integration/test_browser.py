"""The app end to end in a real browser: ``workbench app`` on a free port, Debian's Chromium driven
by Playwright through every page, one probe run, one dynamics analysis and one trace comparison
(all background jobs); screenshots of every page go to the test's tmp dir.

``$WORKBENCH_SCREENSHOTS`` (a folder: docs/app) makes the test the source of docs/app/*.png: once
every page has been shot, it copies the screenshots there with ``screenshots.json``, recording the
commit they were drawn from and the code that draws them (``scripts/results_pages.py --check``
fails when that code changes in a later commit). The app then serves a copy of
``$WORKBENCH_BROWSER_RUNS`` (the docs: runs/quick) instead of the micro zoo:

    WORKBENCH_SCREENSHOTS=docs/app WORKBENCH_BROWSER_RUNS=runs/quick WORKBENCH_REQUIRE_BROWSER=1 \
        .venv/bin/python -m pytest tests/integration/test_browser.py -k every_page

Needs ``/usr/bin/chromium`` (``apt-get install chromium``; never a browser download). Without it
the test is skipped, unless ``WORKBENCH_REQUIRE_BROWSER=1`` (set by CI), where it fails."""

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def results_pages():
    """scripts/results_pages.py: what a screenshot's record holds and which pages there are."""
    spec = importlib.util.spec_from_file_location("results_pages", ROOT / "scripts" / "results_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(runs: Path, tmp_path: Path):
    """``workbench app`` over ``runs`` on a free port, up and answering; its URL."""
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "app", "--runs", str(runs), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"workbench app did not come up: {(tmp_path / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    try:
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()


@pytest.fixture
def server(request, tmp_path):
    given = os.environ.get("WORKBENCH_BROWSER_RUNS")
    source = Path(given) if given else request.getfixturevalue("micro_zoo")  # trained only when needed
    with serving(shutil.copytree(source, tmp_path / "runs"), tmp_path) as url:
        yield url


def require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("WORKBENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing (apt-get install -y chromium)")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")


def settled(page, text: str, timeout_s: float = 240) -> None:
    """Wait for ``text`` and for the script run to finish; fail on an exception element."""
    from playwright.sync_api import expect

    expect(page.get_by_text(text, exact=False).first).to_be_visible(timeout=timeout_s * 1000)
    page.wait_for_function(  # the script run has finished (the attribute Streamlit's own e2e tests read)
        "() => document.querySelector('[data-testid=\"stApp\"]')?.getAttribute('data-test-script-state') === 'notRunning'",
        timeout=timeout_s * 1000,
    )
    page.wait_for_timeout(500)
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, exceptions.first.inner_text()


def test_every_page_in_chromium(server, tmp_path):
    require_chromium()
    from playwright.sync_api import sync_playwright

    pages = results_pages()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    publish = Path(os.environ["WORKBENCH_SCREENSHOTS"]) if os.environ.get("WORKBENCH_SCREENSHOTS") else None
    drawing = pages.record_drawing(pages.SCREENSHOT_CODE) if publish else None  # the code the pages are drawn with

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})

        def settle(text: str) -> None:
            settled(page, text)
            # `workbench app` hides Streamlit's developer toolbar (--client.toolbarMode minimal); with it
            # shown this button is there on every page
            assert page.get_by_role("button", name="Deploy").count() == 0

        def fill(label: str, value: str) -> None:
            page.get_by_label(label).fill(value)
            page.get_by_label(label).press("Enter")

        def shoot(name: str) -> None:
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

        page.goto(server)
        settle("Training curves")
        shoot("runs")

        page.goto(f"{server}/zoo")
        settle("Members across seeds")
        shoot("zoo")

        # the sweep is a background job: it survives leaving the page (in the app, and by loading
        # another URL, a new browser session) and its results show when the page is opened again
        page.goto(f"{server}/probes")
        settle("Train probes")
        fill("Sequences", "40")
        page.get_by_role("button", name="Train probes").click()
        settle("the results appear here when the job is done")
        page.get_by_role("link", name="Runs").click()
        settle("Training curves")
        page.goto(f"{server}/traces")
        settle("Compare")
        page.goto(f"{server}/probes")
        settle("Layer 0: the input to block 0")
        settle("Probe memory on fbt: done")  # the jobs panel
        shoot("probes")

        page.goto(f"{server}/sae")
        settle("Train an SAE")
        fill("Sequences", "64")
        page.get_by_role("button", name="Train an SAE").click()
        settle("Latents by density")  # drawn once the job is done
        shoot("sae")

        page.goto(f"{server}/dynamics")
        settle("Analyse")
        page.get_by_role("button", name="Analyse").click()
        settle("K-pass convergence to the exact recurrence")  # drawn once the job is done
        shoot("dynamics")

        page.goto(f"{server}/traces")
        settle("Trace lengths")
        if page.get_by_text("trace length is not defined").count() == 0:  # a zoo whose task writes traces
            settle("Compare")
            fill("Problems", "8")
            page.get_by_role("button", name="Compare").click()
            settle("One problem under each model and regime")  # drawn once the job is done
        shoot("traces")  # on the flip-flop: the page says why there is no trace to compare

        page.goto(f"{server}/streams")
        settle("Per-stream activation norms")
        shoot("streams")

        page.goto(f"{server}/playground")
        settle("Generate")
        page.get_by_text("Stop at <eos>").click()  # the whole budget: an untrained model may end at once
        settle("Generate")
        page.get_by_role("button", name="Generate").click()
        settle("under each token: ||h|| / gate")  # the soft and fused token strips
        shoot("playground")
        browser.close()

    assert sorted(f.name for f in shots.iterdir()) == sorted(f"{n}.png" for n in pages.SCREENSHOT_PAGES)
    if publish:
        assert pages.record_drawing(pages.SCREENSHOT_CODE) == drawing, "the app's code or HEAD changed while it was shot"
        publish_screenshots(pages, shots, publish, drawing)


def publish_screenshots(pages, shots: Path, folder: Path, drawing: dict) -> None:
    """Every page's screenshot into ``folder`` (a previous page's there replaced), with its record
    in ``screenshots.json``: the commit and code it was drawn from, the runs it shows, its sha256."""
    source = os.environ.get("WORKBENCH_BROWSER_RUNS")
    zoo = Path(source) / "zoo.json" if source else None
    runs = {"runs": source or "the micro zoo (test fixture)"}
    if zoo is not None and zoo.is_file():
        summary = json.loads(zoo.read_text())
        runs["zoo"] = {key: summary.get(key) for key in ("scale", "seeds", "commit")}
    folder.mkdir(parents=True, exist_ok=True)
    entries = {}
    for name in pages.SCREENSHOT_PAGES:
        shutil.copyfile(shots / f"{name}.png", folder / f"{name}.png")
        entries[f"{name}.png"] = {
            **drawing,
            "code": list(pages.SCREENSHOT_CODE),
            **runs,
            "command": pages.SCREENSHOTS_COMMAND,
            "sha256": pages.sha256(folder / f"{name}.png"),
        }
    (folder / pages.SCREENSHOTS_MANIFEST).write_text(json.dumps(entries, indent=1) + "\n")


def test_the_playground_generates_from_an_imported_model_in_chat_format(tmp_path):
    """An imported pretrained model (a byte-level BPE with a chat template) alone in the runs
    directory: the Playground offers its chat format and generates through it."""
    require_chromium()
    from playwright.sync_api import sync_playwright
    from pretrained import imported_run

    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.move(imported_run(tmp_path / "import"), runs / "smol")
    with serving(runs, tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.goto(f"{url}/playground")
        settled(page, "Hugging Face (subword), 300 ids, chat template")
        page.get_by_text("Chat format").click()
        settled(page, "Generate")
        # an imported model has no task to draw a prompt from
        page.get_by_role("textbox", name="Prompt").fill("What is two plus three?")
        page.get_by_role("textbox", name="Prompt").press("Control+Enter")
        settled(page, "Generate")
        page.get_by_role("button", name="Generate").click()
        settled(page, "Prompt sent to the model")
        page.get_by_text("Prompt sent to the model").click()
        settled(page, "<|im_start|>user")
        page.screenshot(path=str(tmp_path / "playground-imported.png"), full_page=True)
        browser.close()
