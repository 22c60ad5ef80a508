"""The README's quick start stays true: CI runs its test command verbatim."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line for line in lines if line.startswith("python3 -m venv .venv")]


def test_ci_runs_the_readme_test_command():
    main_job, test_command = _commands()
    assert main_job.endswith("workbench app") and "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_readme_names_no_path_outside_a_users_clone():
    """A user's clone has no ``../shared``; the README's commands use paths the user
    makes (``data/``, git-ignored, with where GSM8K comes from said beside it)."""
    text = (ROOT / "README.md").read_text()
    assert "../shared" not in text
    assert "data/gsm8k/train.jsonl" in text and "github.com/openai/grade-school-math" in text
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "/data/" in ignored and "/corpora/" in ignored


def _duration(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def test_the_first_hours_numbers_are_the_walks_record():
    """The README's first-hour numbers come from ``scripts/first_hour.py``'s record of
    a walk through the app from a fresh clone (a clean tree), not from an earlier, dirty one."""
    import json

    walk = json.loads((ROOT / "docs" / "results" / "first_hour.json").read_text())
    assert walk["zoo"] == "quick" and walk["clean tree"] is True and walk["command"] == "python scripts/first_hour.py"
    text = " ".join((ROOT / "README.md").read_text().split())
    seconds = walk["seconds"]
    assert f"`quick` ({_duration(seconds['train the quick zoo'])} on 2 cores" in text
    assert f"**Train probes** (a job; {_duration(seconds['train probes (defaults)'])} at the defaults)" in text
    assert f"**Analyse** ({_duration(seconds['analyse the feedback dynamics (defaults)'])})" in text
    probe = walk["shown"]["layer-0 probe"]
    assert f"{probe['standard']:.3f} under standard prefill, {probe['recurrent K=2']:.3f} under recurrent K = 2" in text
    assert f"{probe['recurrent K=3']:.3f} at K = 3" in text
    # a headline read from an unconverged probe says so
    assert walk["shown"]["layer-0 probe converged"] or "stopped at its iteration limit" in text
    dynamics = walk["shown"]["dynamics input"]
    assert dynamics["input_task"] == dynamics["run_task"] == walk["shown"]["task"][0]  # the run's own problem
    assert f"tangent exponent at T = 100 is {walk['shown']['lyapunov tangent']['100']:.3f}" in text
    assert set(walk["shown"]["held-out accuracy"].values()) == {1.0}  # 'Every member learns it'
    assert "Every member learns it" in text


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (lower case, punctuation dropped, spaces
    to hyphens, ``-1``, ``-2`` after repeats)."""
    found, seen = set(), {}
    for line in path.read_text().splitlines():
        if m := re.match(r"^#+\s+(.*)$", line):
            anchor = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
            seen[anchor] = seen.get(anchor, 0) + 1
    return found


def broken_links(files: list[Path]) -> list[str]:
    """Each relative link ``[text](path#anchor)`` outside code blocks whose file or heading is not there."""
    bad = []
    for path in files:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", link):  # https:, mailto:
                continue
            name, _, anchor = link.partition("#")
            target = (path.parent / name).resolve() if name else path
            if not target.exists():
                bad.append(f"{path.name}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                bad.append(f"{path.name}: {link} (no such heading)")
    return bad


def test_every_relative_link_in_the_readme_and_docs_resolves(tmp_path):
    assert not broken_links([ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    page = tmp_path / "page.md"
    page.write_text("# A title\n## A title\n[ok](#a-title-1) [gone](#a-titles) [none](nothere.md)\n```\n[code](x.md)\n```\n")
    assert broken_links([page]) == ["page.md: #a-titles (no such heading)", "page.md: nothere.md (no such file)"]


@pytest.mark.parametrize("page", ["README.md", "docs/claims.md"])
def test_the_readmes_claim_counts_are_the_claims_tables(page):
    """The README's summary of the claims table, and docs/claims.md's, count what
    ``docs/results/claims.json`` holds: rows, claims, organisms and each verdict, so a
    regeneration that moves a verdict fails here until the pages say so."""
    import json
    from collections import Counter

    rows = json.loads((ROOT / "docs" / "results" / "claims.json").read_text())["rows"]
    text = " ".join((ROOT / page).read_text().split())
    claims, organisms = len({r["claim"] for r in rows}), len({r["organism"] for r in rows})
    assert f"of {len(rows)} rows ({claims} claims on {organisms} organisms" in text
    verdicts = Counter(r["verdict"] for r in rows)
    named = "reproduced|contradicted|no detectable difference|inconclusive at this power|not testable here"
    found = {v: int(n) for n, v in re.findall(rf"\*\*(\d+) ({named})\*\*", text)}
    assert found == {v: n for v, n in verdicts.items() if v != "not measured yet"}
    assert f"and {verdicts['not measured yet']} not measured yet" in text
    untestable = [r["why"] for r in rows if r["verdict"] == "not testable here"]
    keys = {
        "at the ceiling": "{} at an organism's ceiling",
        "cannot show": "{} where the claim cannot show on the organism",
        "did not learn": "{} where an arm did not learn the task",
        "no difficulty band": "{} where no difficulty band leaves the baseline room",
        "chain prompt": "{} where the rollouts continued a chain prompt",
    }
    reasons = {key: sum(key in why for why in untestable) for key in keys}
    assert sum(reasons.values()) == len(untestable)
    for key, words in keys.items():  # each reason the table gives, in the README's words
        assert (words.format(reasons[key]) in text) == (reasons[key] > 0), words


def test_the_app_pages_job_times_are_the_measurements_record():
    """docs/app.md's times of jobs beside another job, before and after the thread budget, are
    ``scripts/job_threads.py``'s record."""
    import json

    measured = json.loads((ROOT / "docs" / "results" / "job_threads.json").read_text())["seconds"]
    text = " ".join((ROOT / "docs" / "app.md").read_text().split())
    b, a = ({k: round(v[key]) for k, v in measured.items()} for key in ("median_before", "median_after"))
    ratio = {k: f"{v['ratio']:.1f}x" for k, v in measured.items()}
    assert f"the probe sweep took {b['probe']} s, the dynamics analysis {b['dynamics']} s and the SAE {b['sae']} s" in text
    assert (
        f"{a['probe']} s, {a['dynamics']} s and {a['sae']} s: {ratio['probe']}, {ratio['dynamics']} and {ratio['sae']} faster"
        in text
    )
