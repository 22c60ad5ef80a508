"""Trace-length studies: parsing, counting, the paired bootstrap, determinism."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from workbench import build_model, save_model
from workbench.runtime.tokenizer import CharTokenizer
from workbench.studies.traces import paired_bootstrap, problems, read_traces, summarise, trace_length, trace_study


def test_trace_length_counts_tokenizer_tokens_before_the_marker():
    tok = CharTokenizer()
    text = "12+7=<<12+7=19>>19\n#### 19"
    assert trace_length(text, tok) == len(tok.encode("12+7=<<12+7=19>>19\n")) == 19
    assert trace_length("no marker at all", tok) == len(tok.encode("no marker at all"))
    assert trace_length("#### 5", tok) == 0


def test_paired_bootstrap_recovers_a_known_difference():
    rng = np.random.default_rng(0)
    a = rng.normal(50, 10, size=400)
    b = a - 7 + rng.normal(0, 3, size=400)  # 7 tokens shorter on every problem, plus noise
    result = paired_bootstrap(a, b, seed=1)
    assert result["ci_low"] < -7 < result["ci_high"] and result["ci_high"] - result["ci_low"] < 1.5
    null = paired_bootstrap(a, a + rng.normal(0, 3, size=400), seed=1)
    assert null["ci_low"] < 0 < null["ci_high"]
    with pytest.raises(ValueError, match="equal-length"):
        paired_bootstrap([1, 2], [1])


def test_problems_are_deterministic_and_spread_over_difficulties(tmp_path):
    a, b = problems("chain", 30, [1, 3], seed=2), problems("chain", 30, [1, 3], seed=2)
    assert [e.text for e in a] == [e.text for e in b]
    assert sorted({e.difficulty for e in a}) == [1, 3] and sum(e.difficulty == 1 for e in a) == 15
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}) + "\n")
    assert [e.answer for e in problems(f"gsm8k-jsonl:{path}", 1, None, 0)] == ["4"]
    with pytest.raises(ValueError, match="has 1 problems with a final answer; n_problems=10 asks for more"):
        problems(f"gsm8k-jsonl:{path}", 10, None, 0)
    with pytest.raises(ValueError, match="unknown trace task 'gsm8k'"):
        problems("gsm8k", 3, [1], 0)


def test_addition_problems_spread_over_digits_and_the_model_chooses_the_verbosity():
    a = problems("addition", 30, [1, 3], seed=2)
    assert [e.text for e in a] == [e.text for e in problems("addition", 30, [1, 3], seed=2)]
    assert [e.difficulty for e in a] == [1, 3] * 15
    assert all(len(e.prompt.removeprefix("Q: ").split("+")[0]) == e.difficulty for e in a)  # the first has them all
    assert a[0].prompt != problems("chain", 1, [1], seed=2)[0].prompt
    with pytest.raises(ValueError, match=r"difficulties=\[0\]: expected digit counts >= 1"):
        problems("addition", 3, [0], 0)
    with pytest.raises(ValueError, match=r"difficulties=\[65\]: expected at most 64 digits"):
        problems("addition", 3, [65], 0)


def test_summary_groups_and_pairs():
    rows = [
        {
            "model": m,
            "regime": "standard",
            "problem_id": i,
            "difficulty": 1 + i % 2,
            "trace_tokens": 10 + i + (5 if m == "b" else 0),
            "correct": i % 2 == 0,
            "finished": True,
        }
        for m in ("a", "b")
        for i in range(20)
    ]
    s = summarise(rows, ("a", "standard"))
    assert s["groups"]["a/standard"]["mean_trace"] == 19.5 and s["groups"]["b/standard"]["accuracy"] == 0.5
    assert s["paired"]["b/standard - a/standard"]["trace_tokens"]["mean"] == 5.0
    assert set(s["groups"]["a/standard"]["by_difficulty"]) == {"1", "2"}


@pytest.mark.slow
def test_trace_cli_is_deterministic_and_writes_every_output(tmp_path, capsys):
    from workbench.cli import main

    runs = [
        save_model(build_model("fbt", "debug"), tmp_path / "fbt"),
        save_model(build_model("hd", "debug", n_streams=2), tmp_path / "hd"),
    ]
    for out in ("a", "b"):
        main(
            [
                "traces",
                *map(str, runs),
                "--task",
                "chain",
                "--n",
                "6",
                "--difficulty",
                "1..2",
                "--max-new-tokens",
                "12",
                "--out",
                str(tmp_path / out),
            ]
        )
    rows = list(csv.DictReader((tmp_path / "a" / "traces.csv").open()))
    assert rows == list(csv.DictReader((tmp_path / "b" / "traces.csv").open()))
    assert len(rows) == 6 * 4  # fbt x 3 regimes + hd x standard
    assert {(r["model"], r["regime"]) for r in rows} == {
        ("fbt", "standard"),
        ("fbt", "soft"),
        ("fbt", "fused"),
        ("hd", "standard"),
    }
    fbt_row = next(r for r in rows if r["model"] == "fbt")
    assert len(json.loads(fbt_row["state_norms"])) == int(fbt_row["total_tokens"])
    assert all(int(r["trace_tokens"]) <= int(r["total_tokens"]) for r in rows)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["reference"] == "fbt/standard" and "hd/standard - fbt/standard" in summary["paired"]
    printed = capsys.readouterr()
    assert (tmp_path / "a" / "traces.png").is_file() and "problems/s" in printed.out
    assert "traces: 100%" in printed.err and "hd/standard: 6/6 problems" in printed.err  # the progress bar
    # read back with its types, the rows summarise to what the study wrote (the app reads them so)
    typed = read_traces(tmp_path / "a" / "traces.csv")
    assert {r["format"] for r in typed} == {"completion"} and summary["chat"] is None
    assert all(isinstance(r["correct"], bool) and isinstance(r["trace_tokens"], int) for r in typed)
    assert next(r for r in typed if r["model"] == "hd")["state_norms"] is None
    again = json.loads(json.dumps(summarise(typed, ("fbt", "standard"))))
    assert {k: summary[k] for k in again} == again


SAMPLE = Path(__file__).resolve().parents[1] / "data" / "gsm8k_sample.jsonl"  # real GSM8K problems (MIT)


def test_real_gsm8k_problems_each_get_the_whole_budget_or_are_skipped_and_listed(tmp_path):
    """The shipped GSM8K sample holds prompts of 102-991 characters and non-ASCII characters. With
    n_ctx=512 and a 64-token budget, every problem that fits generates until <eos> or exactly 64
    tokens, whatever shares its batch; the two that do not fit are skipped and listed; characters the
    character tokenizer cannot represent are counted per problem."""
    run = save_model(build_model("baseline", "debug", n_ctx=512), tmp_path / "run")
    task = f"gsm8k-jsonl:{SAMPLE}"
    summary = trace_study([str(run)], tmp_path / "t", task=task, n_problems=43, max_new_tokens=64, batch_size=64)
    examples = problems(task, 43, None)
    lengths = [len(ex.prompt) for ex in examples]  # characters = tokens for the character tokenizer
    too_long = [i for i, n in enumerate(lengths) if n + 64 > 512]
    assert len(too_long) == 2 and summary["skipped"]["run"] == {
        "n": 2,
        "problem_ids": too_long,
        "rule": "prompt + max_new_tokens=64 > n_ctx=512",
    }
    with (tmp_path / "t" / "traces.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["problem_id"]) for r in rows) == [i for i in range(43) if i not in too_long]
    assert all(r["finished"] == "True" or int(r["total_tokens"]) == 64 for r in rows)
    lost = {int(r["problem_id"]): int(r["lost_characters"]) for r in rows}
    char = CharTokenizer()
    assert lost == {i: sum(char.lost_characters(examples[i].prompt).values()) for i in lost}
    assert sum(lost.values()) == summary["lost_characters"]["run"] > 0  # ’ and ñ in the sample
    assert summary["difficulties"] == "any" and summary["n_problems"] == 43


def test_a_run_that_fits_no_problem_is_refused_before_any_work(tmp_path):
    from helpers import assert_usage_error, cli

    run = save_model(build_model("baseline", "debug"), tmp_path / "run")  # n_ctx=128: no GSM8K prompt fits
    assert_usage_error(
        ["traces", str(run), "--task", f"gsm8k-jsonl:{SAMPLE}", "--n", "5", "--out", str(tmp_path / "t")],
        "no problem fits",
        "n_ctx=128",
    )
    assert not (tmp_path / "t").exists()
    wide = save_model(build_model("baseline", "debug", n_ctx=512), tmp_path / "wide")
    code, out, err = cli(
        ["traces", str(wide), "--task", f"gsm8k-jsonl:{SAMPLE}", "--n", "43"]
        + ["--max-new-tokens", "64", "--out", str(tmp_path / "t")]
    )
    assert code is None, err
    assert "wide: skipped 2 of 43 problems (prompt + max_new_tokens=64 > n_ctx=512)" in out
    assert "wide: its tokenizer cannot represent" in out


def test_regimes_without_standard_pair_against_what_exists_and_bad_choices_fail_before_work(tmp_path):
    """``--regimes soft,fused`` used to generate everything and then fail pairing against a
    ``standard`` that was never run; now the default reference is the first pair that exists, a
    named one must exist, and unknown regimes are refused, both before any generation."""
    from helpers import assert_usage_error, cli

    run = str(save_model(build_model("fbt", "debug"), tmp_path / "fbt"))
    common = ["--task", "chain", "--n", "4", "--difficulty", "1..2", "--max-new-tokens", "8"]
    code, out, err = cli(["traces", run, "--regimes", "soft,fused", *common, "--out", str(tmp_path / "a")])
    assert code is None, err
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["reference"] == "fbt/soft" and list(summary["paired"]) == ["fbt/fused - fbt/soft"]
    code, out, err = cli(
        ["traces", run, "--regimes", "soft,fused", "--reference", "fbt/fused", *common, "--out", str(tmp_path / "b")]
    )
    assert code is None, err
    assert list(json.loads((tmp_path / "b" / "summary.json").read_text())["paired"]) == ["fbt/soft - fbt/fused"]
    assert_usage_error(
        ["traces", run, "--regimes", "soft,fused", "--reference", "fbt/standard", *common, "--out", str(tmp_path / "c")],
        "reference 'fbt/standard' is not one of the study's (model/regime) pairs: fbt/soft, fbt/fused",
    )
    assert_usage_error(
        ["traces", run, "--regimes", "soft,fussed", *common, "--out", str(tmp_path / "c")], "regimes 'soft,fussed'"
    )
    assert not (tmp_path / "c").exists()
