"""The app's long studies as background jobs (``workbench.jobs``): a page starts the CLI verb,
and every page that shows the job (after a reload, or in another tab) reads its state from disk."""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from pathlib import Path

import streamlit as st

from app.state import app_root, device, job_threads, stamp, writable
from workbench.cli import ANALYSIS_VERBS
from workbench.jobs import Job, cancel_job, list_jobs, start_job
from workbench.storage.errors import BadInput

REFRESH_S = 1.0  # how often a page with a running job redraws its jobs
SHOWN = 5  # finished jobs listed per page


def start(argv: list[str], *, title: str, page: str, outputs: list[Path]) -> Job | None:
    """Start ``workbench ARGV`` as a job of ``page`` writing ``outputs`` (each must lie under the
    runs root); None, with an error element, if refused or if a job of this page already writes
    one of them."""
    if not writable(*outputs):
        return None
    busy = [j for j in list_jobs(app_root(), page) if j.running and set(j.outputs) & {str(o) for o in outputs}]
    if busy:
        st.error(f"A job is already writing there: {busy[0].title} (started {when(busy[0].created)}). Wait for it or cancel it.")
        return None
    if argv[0] in ANALYSIS_VERBS:
        if device() != "cpu":  # the sidebar's device; the CLI's default is cpu
            argv = [*argv, "--device", device()]
        argv = [*argv, "--threads", str(job_threads(sum(j.running for j in list_jobs(app_root()))))]
    try:
        return start_job(app_root(), [*argv, "--no-progress"], title=title, page=page, outputs=[str(o) for o in outputs])
    except (BadInput, OSError) as err:  # a planted link for the jobs directory, a full disk
        st.error(f"Could not start the job: {err}")
        return None


def keyed_output(kind: str, chosen: list, settings: dict) -> Path:
    """Where a job of ``kind`` on the ``chosen`` runs with ``settings`` writes: the first run's
    ``results/KIND-KEY/``, KEY hashing the runs' paths and weights and every setting, so the same
    inputs find the saved result."""
    inputs = [[str(r.path), stamp(r.path)] for r in chosen] + [settings]
    key = hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:12]
    return chosen[0].path / "results" / f"{kind}-{key}"


def running(page: str, output: Path | None = None) -> list[Job]:
    """The running jobs of ``page`` (writing ``output``, if given)."""
    return [j for j in list_jobs(app_root(), page) if j.running and (output is None or str(output) in j.outputs)]


def when(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp).strftime("%H:%M:%S")


def panel(page: str) -> None:
    """``page``'s jobs: each running one with its progress, what it is doing and a Cancel button;
    the last finished ones with their state (a failure with its log). While one runs the panel
    redraws itself every ``REFRESH_S``; when one ends the whole page reruns to show its results."""
    jobs = list_jobs(app_root(), page)
    if not jobs:
        return
    live = any(j.running for j in jobs)

    @st.fragment(run_every=REFRESH_S if live else None)
    def draw() -> None:
        now = list_jobs(app_root(), page)
        seen = st.session_state.setdefault(f"jobs_running_{page}", set())
        ended = {j.id for j in now if not j.running} & seen
        seen.clear()
        seen.update(j.id for j in now if j.running)
        passed = st.session_state.setdefault(f"jobs_milestones_{page}", {})
        milestones = {j.id: j.progress.get("milestone") or 0 for j in now if j.running}
        moved = any(m > passed.get(i, m) for i, m in milestones.items())  # a member finished: show it
        passed.clear()
        passed.update(milestones)
        if ended or moved:
            st.rerun()  # the page: show what the job wrote
        with st.container(border=True):
            st.markdown("**Jobs** (background processes: they go on if you leave this page or close the tab)")
            invalid = [j for j in now if j.state == "invalid"]  # every one: they need the user, however old
            finished = [j for j in now if not j.running and j.state != "invalid"]
            for job in [j for j in now if j.running] + invalid + finished[:SHOWN]:
                draw_job(job)

    draw()


def clock(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def progress_counts(progress: dict, created: float, now: float) -> str:
    """`` (12 of 40 steps, 0:35 elapsed, about 1:10 left)``: the count of the phase in progress
    (``workbench.runtime.progress.Bar``), the job's time so far and the phase's estimate at its
    rate so far; what a progress file lacks is left out."""
    parts = []
    n, total, unit = progress.get("n"), progress.get("total"), progress.get("unit") or ""
    if n is not None and total and unit in ("", "it"):  # a count of no unit: a share of the work
        parts.append(f"{n / total:.0%}")
    elif n is not None and total:
        parts.append(f"{n:,.0f} of {total:,.0f} {unit}{'' if unit.endswith('s') else 's'}")
    parts.append(f"{clock(now - created)} elapsed")
    started, updated = progress.get("started"), progress.get("updated")
    if n and total and started is not None and updated is not None and updated > started and n < total:
        parts.append(f"about {clock((total - n) * (updated - started) / n)} left")
    return " (" + ", ".join(parts) + ")"


def draw_job(job: Job) -> None:
    """One job: its progress and Cancel while it runs, its end once over; a job whose files are not
    what the workbench writes is an error naming the file and the field (``workbench.jobs``
    validated them: every value drawn here is in range)."""
    started = when(job.created)
    if job.state == "invalid":
        st.error(f"Job {job.id} cannot be shown: {job.error}")
        return
    if job.progress_error:
        st.error(f"{job.title}: its progress cannot be shown: {job.progress_error}")
    if job.running:
        fraction = job.progress.get("fraction")
        what = " ".join(filter(None, (job.progress.get("desc"), job.progress.get("what")))) or job.state
        what += progress_counts(job.progress, job.created, time.time())
        if job.state == "orphaned":
            what = f"its supervisor was killed; the verb (PID {job.verb_pid}) still runs and holds its outputs"
        c1, c2 = st.columns([5, 1])
        c1.progress(0.0 if fraction is None else float(fraction), text=f"{job.title} (started {started}): {what}")
        if job.cancellable:
            if c2.button("Cancel", key=f"cancel_{job.id}"):
                cancel_job(job)
                st.rerun()
        elif job.unverified:
            c2.caption(f"PID {job.pid} cannot be checked from here: stop it where it runs")
        return
    ended = when(job.finished) if job.finished else "?"
    if job.state == "done":
        st.success(f"{job.title}: done ({started} - {ended})", icon=":material/check:")
    elif job.state == "cancelled":
        st.warning(f"{job.title}: cancelled ({started} - {ended})")
    else:
        why = "its process was killed" if job.state == "lost" else job.reason or f"exit status {job.returncode}"
        st.error(f"{job.title}: {job.state} ({why}; started {started}). Log: {job.path / 'log.txt'}")
        st.code(job.log_tail(2000) or "(empty log)", language=None)
