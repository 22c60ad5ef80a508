"""Synthetic tasks: deterministic, labelled per character, and in GSM8K format."""

import json
import re

import pytest

from workbench.data.answers import is_correct, parse_final_answer
from workbench.data.tasks import TaskConfig, gsm8k_example, load_jsonl, load_task, load_text, synthetic_examples
from workbench.data.windows import TokenStream, batch_windows
from workbench.runtime.tokenizer import CharTokenizer
from workbench.storage.errors import BadInput


@pytest.mark.parametrize("task", ["chain", "modsum", "flipflop", "perm", "addition", "mix"])
def test_same_seed_same_examples_and_labels_align(task):
    a = synthetic_examples(task, 50, seed=3)
    b = synthetic_examples(task, 50, seed=3)
    c = synthetic_examples(task, 50, seed=4)
    assert [e.text for e in a] == [e.text for e in b] != [e.text for e in c]
    for ex in a:
        assert ex.text.startswith(ex.prompt) and ex.completion
        assert all(len(v) == len(ex.text) for v in ex.labels.values())
        assert CharTokenizer().decode(CharTokenizer().encode(ex.text)) == ex.text


def test_mix_follows_its_weights():
    tasks = [e.task for e in synthetic_examples("mix", 300, 0, TaskConfig(mix_weights=(0, 1, 3)))]
    assert "chain" not in tasks and 0.15 < tasks.count("modsum") / 300 < 0.35


@pytest.mark.parametrize("merge", [1, 2, 4])
def test_chain_steps_are_correct_arithmetic_in_gsm8k_format(merge):
    for ex in synthetic_examples("chain", 100, 0, TaskConfig(chain_merge=merge, chain_max_steps=4)):
        steps = re.findall(r"<<([^=]+)=(-?\d+)>>(-?\d+)", ex.completion)
        assert steps and all(eval(expr) == int(v) == int(w) for expr, v, w in steps)  # noqa: S307 (our own digits)
        assert parse_final_answer(ex.completion) == ex.answer == steps[-1][1]
        assert len(steps) == -(-ex.difficulty // merge)
        known = [v for v in ex.labels["value"] if v >= 0]
        assert known[-1] == int(ex.answer)


def test_verbosity_changes_trace_length_not_the_answer():
    verbose = synthetic_examples("chain", 40, 1, TaskConfig(chain_merge=1))
    terse = synthetic_examples("chain", 40, 1, TaskConfig(chain_merge=4))
    assert [e.answer for e in verbose] == [e.answer for e in terse]
    multi = [(v, t) for v, t in zip(verbose, terse) if v.difficulty > 1]
    assert multi and all(len(v.completion) > len(t.completion) for v, t in multi)


def test_modsum_labels_are_running_sums():
    cfg = TaskConfig(modsum_p=5)
    for ex in synthetic_examples("modsum", 50, 0, cfg):
        digits = ex.prompt[2:-1]
        for i in range(len(digits)):
            assert ex.labels["running_sum"][2 + i] == sum(map(int, digits[: i + 1])) % 5
        assert int(ex.answer) == sum(map(int, digits)) % 5 == ex.labels["running_sum"][-1]


def test_flipflop_answers_read_the_memory_label():
    for ex in synthetic_examples("flipflop", 50, 0, TaskConfig(flipflop_bits=4)):
        text, memory = ex.text, ex.labels["memory"]
        for m in re.finditer(r"\?([a-d])([01])", text):
            channel = "abcd".index(m.group(1))
            assert int(m.group(2)) == (memory[m.start(1)] >> channel) & 1
        assert ex.prompt.endswith("?" + ex.prompt[-1]) and ex.completion in "01"


@pytest.mark.parametrize(
    "text,want",
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
        ("#### 1,234", "1234"),
        ("#### -5.5 dollars", "-5.5"),
        ("no marker here: 12", None),
        ("#### twelve", None),
        ("#### 3\n#### 4", "3"),  # several: the first counts
        ("####", None),
    ],
)
def test_final_answer_parsing(text, want):
    assert parse_final_answer(text) == want


def gsm8k_official(completion: str) -> str:
    """GSM8K's published extraction rule, written out here from its description: the first
    '#### ' (one space) followed by -?[0-9.,]+, stripped, commas removed; '[invalid]' otherwise."""
    found = re.search(r"#### (\-?[0-9\.\,]+)", completion)
    return found.group(1).strip().replace(",", "") if found else "[invalid]"


@pytest.mark.parametrize(
    "text",
    [
        "#### 72",
        "####72",  # no space: invalid
        "####  72",  # two spaces: invalid
        "#### 72.",  # a trailing dot stays: "72." is not "72"
        "#### 72.\n",
        "The answer is 72.\n#### 72",
        "#### 1,234,567",
        "#### -3",
        "#### - 3",
        "#### -",
        "#### .5",
        "#### 1.2.3",
        "#### ,",
        "#### \u0667\u0662",  # Arabic-Indic digits: invalid
        "#### \uff17\uff12",  # fullwidth digits: invalid
        "#### 72 dollars\n#### 73",
        "##### 72",  # five hashes contain '#### '
        "#### $72",
        "",
    ],
)
def test_the_answer_rule_is_gsm8ks_official_extraction(text):
    official = gsm8k_official(text)
    assert parse_final_answer(text) == (None if official == "[invalid]" else official)


def test_a_trailing_dot_or_a_missing_space_is_wrong_as_in_gsm8k():
    ex = gsm8k_example("How many?", "12*6=<<12*6=72>>72\n#### 72")
    assert ex.answer == "72" and is_correct(ex, "#### 72")
    for wrong in ("#### 72.", "####72", "####  72", "#### \u0667\u0662"):
        assert not is_correct(ex, wrong), wrong


def test_gsm8k_jsonl_and_text_files(tmp_path):
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": "What is 2+3?", "answer": "2+3=<<2+3=5>>5\n#### 5"}, {"question": "q", "answer": "no answer"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    examples = load_task(f"jsonl:{path}", 0, 0)
    assert [e.answer for e in examples] == ["5", ""] and examples[0].prompt == "Q: What is 2+3?\nA:"
    path.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match=r"gsm.jsonl:1: expected an object with 'question' and 'answer'"):
        load_jsonl(path)
    path.write_text("{oops\n")
    with pytest.raises(ValueError, match=r"gsm.jsonl:1: not JSON"):
        load_jsonl(path)
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_task(f"jsonl:{tmp_path / 'nowhere.jsonl'}", 0, 0)
    (tmp_path / "t.txt").write_text("x" * 1100)
    assert [len(e.text) for e in load_text(tmp_path / "t.txt")] == [512, 512, 76]


def test_batches_are_a_function_of_seed_and_step():
    stream = TokenStream.from_examples(synthetic_examples("mix", 200, 0), CharTokenizer())
    x1, y1 = batch_windows(stream, 0, 5, 8, 32)
    x2, y2 = batch_windows(stream, 0, 5, 8, 32)
    x3, _ = batch_windows(stream, 0, 6, 8, 32)
    assert (x1 == x2).all() and (y1 == y2).all() and not (x1 == x3).all()
    assert (x1[:, 1:] == y1[:, :-1]).all()
    assert int((stream.ids == CharTokenizer().eos_id).sum()) == 200


def test_gsm8k_answers_are_scored_by_the_number_after_the_marker():
    """GSM8K, like chain, is scored by the number after ``####``, wherever it stands in the
    generation; the prefix rule of the other tasks would mark this right answer wrong."""
    ex = gsm8k_example("How many?", "3 + 4 = <<3+4=7>>7 apples.\n#### 7")
    assert is_correct(ex, " 3 + 4 = 7 apples.\n#### 7")
    assert not is_correct(ex, " 7 apples.\n#### 8")


def test_last_number_is_the_final_number_of_prose_answers():
    from workbench.data.answers import last_number

    assert last_number("13 + 15 = 28") == "28"
    assert last_number("The final answer is 15.") == "15"  # a trailing full stop is not a decimal point
    assert last_number("She earns $1,250.50 in total.") == "1250.50"
    assert last_number("from 3 down to -4") == "-4"
    assert last_number("#### 72") == "72"
    assert last_number("no digits here") is None


def test_mixed_verbosity_writes_each_problem_its_own_way_and_keeps_the_problems():
    """With chain_merge_weights = (1, 1) each answer line writes one or two steps, drawn per line:
    examples mix written and merged steps, the arithmetic and answers stay right, the problems
    are exactly those of every-step verbosity, and a problem is always written the same way."""
    cfg = TaskConfig(chain_merge_weights=(1, 1), chain_max_steps=4)
    mixed = synthetic_examples("chain", 200, 3, cfg)
    verbose = synthetic_examples("chain", 200, 3, TaskConfig(chain_max_steps=4))
    assert [e.prompt for e in mixed] == [e.prompt for e in verbose] and [e.answer for e in mixed] == [e.answer for e in verbose]
    assert [e.completion for e in synthetic_examples("chain", 200, 3, cfg)] == [e.completion for e in mixed]
    shapes = set()
    for ex in mixed:
        steps = re.findall(r"<<([^=]+)=(-?\d+)>>(-?\d+)", ex.completion)
        assert all(eval(expr) == int(v) == int(w) for expr, v, w in steps)  # noqa: S307 (our own digits)
        assert -(-ex.difficulty // 2) <= len(steps) <= ex.difficulty and steps[-1][1] == ex.answer
        ops = [len(re.findall(r"[+*]|(?<=\d)-", expr)) for expr, _, _ in steps]  # steps written in each line
        assert sum(ops) == ex.difficulty and set(ops) <= {1, 2}
        shapes.add(tuple(ops))
    assert any(1 in s and 2 in s for s in shapes)  # some examples both write and merge
    assert sum(len(e.completion) for e in mixed) < sum(len(e.completion) for e in verbose)


@pytest.mark.parametrize("weights", [(0, 0), (1, -1), tuple([1.0] * 9)])
def test_bad_merge_weights_are_refused_by_name(weights):
    with pytest.raises(BadInput, match=r"data field chain_merge_weights=.*expected \(\) or 1\.\.8 non-negative weights"):
        TaskConfig(chain_merge_weights=weights)


def test_merge_weights_come_from_the_command_line_and_are_recorded():
    from workbench.training.runconfig import make_run_config

    cfg = make_run_config("baseline", "debug", "chain", ["data.chain_merge_weights=3,1"])
    assert cfg.to_dict()["data"]["chain_merge_weights"] in ([3.0, 1.0], (3.0, 1.0))


# ---- the organisms' tasks: perm, addition, flip-flop densities --------------------------------


def _product(points: int, letters: str) -> list[int]:
    """Where each point ends after applying the letters' permutations in reading order, worked
    out independently of the task: permutations enumerated by hand as lists, applied to points."""
    if points == 3:
        elements = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]]
    else:
        import itertools

        elements = [list(p) for p in itertools.permutations(range(points))]
    where = list(range(points))
    for letter in letters:
        g = elements[ord(letter) - ord("a")]
        where = [g[x] for x in where]
    return where


@pytest.mark.parametrize("points", [3, 4])
def test_perm_answers_and_labels_are_the_running_product(points):
    import itertools

    elements = [list(p) for p in itertools.permutations(range(points))]
    seen = set()
    for ex in synthetic_examples("perm", 200, 0, TaskConfig(perm_points=points, perm_min_len=1, perm_max_len=10)):
        letters = ex.prompt.removeprefix("P:").removesuffix("=")
        assert len(letters) == ex.difficulty and 1 <= ex.difficulty <= 10
        assert elements[ord(ex.answer) - ord("a")] == _product(points, letters)
        states = ex.labels["perm_state"]
        for i in range(len(letters) + 1):  # after "P:" and each letter: the product so far
            assert elements[states[1 + i]] == _product(points, letters[:i])
        assert states[-2:] == [ord(ex.answer) - ord("a")] * 2
        seen.update(letters)
    assert len(seen) == len(elements)  # every element is drawn


def test_perm_composes_in_reading_order():
    # b swaps points 1 and 2, c swaps 0 and 1: b then c sends 0 -> 1, 1 -> 2 -> 2, 2 -> 1 -> 0
    # (worked by hand), which is [1, 2, 0] = d; c then b is [2, 0, 1] = e: the group is not abelian
    from workbench.data.tasks import PERMUTATIONS, compose

    b, c = PERMUTATIONS[3][1], PERMUTATIONS[3][2]
    assert compose(b, c) == (1, 2, 0) == PERMUTATIONS[3][3]
    assert compose(c, b) == (2, 0, 1) == PERMUTATIONS[3][4]


def _schoolbook(a: int, b: int) -> list[int]:
    """The carry into each digit of a + b, least significant first."""
    carries, carry = [], 0
    while a or b or carry:
        carries.append(carry)
        carry = (a % 10 + b % 10 + carry) // 10
        a, b = a // 10, b // 10
    return carries or [0]


@pytest.mark.parametrize("weights", [(1.0,), (0.0, 1.0), (0.0, 0.0, 1.0), (1.0, 1.0, 1.0)])
def test_addition_scratchpads_are_correct_and_the_answer_is_the_reversed_sum(weights):
    cfg = TaskConfig(add_min_digits=1, add_max_digits=5, add_verbosity_weights=weights)
    for ex in synthetic_examples("addition", 150, 0, cfg):
        ra, rb = ex.prompt.removeprefix("Q: ").removesuffix("\nA:").split("+")
        a, b = int(ra[::-1]), int(rb[::-1])
        assert ex.answer == str(a + b)[::-1] and parse_final_answer(ex.completion) == ex.answer
        assert ex.difficulty == max(len(ra), len(rb))
        lines = re.findall(r"(\d+)\+(\d+)\+(\d)=(\d+),(\d)", ex.completion)
        carry, done = 0, 0
        for ca, cb, c_in, digits, c_out in lines:  # each line: chunk sums, digits reversed
            assert int(c_in) == carry and len(ca) == len(cb) == len(digits)
            total = int(ca[::-1]) + int(cb[::-1]) + carry
            assert digits == str(total % 10 ** len(ca)).rjust(len(ca), "0")[::-1] and int(c_out) == total // 10 ** len(ca)
            carry, done = int(c_out), done + len(ca)
        assert done in (0, ex.difficulty)
        if weights == (1.0,):
            assert not lines and ex.completion == f" #### {ex.answer}"
        answer_labels = ex.labels["carry"][len(ex.text) - len(ex.answer) :]
        assert answer_labels == _schoolbook(a, b)[: len(ex.answer)]


def test_addition_verbosity_is_a_property_of_the_problem_and_keeps_the_problems():
    plain = synthetic_examples("addition", 200, 5, TaskConfig(add_verbosity_weights=(1.0,)))
    mixed = synthetic_examples("addition", 200, 5, TaskConfig(add_verbosity_weights=(1.0, 1.0, 1.0)))
    assert [e.prompt for e in plain] == [e.prompt for e in mixed]
    lines = [e.completion.count("\n") for e in mixed]
    # three verbosities drawn: none (0 lines), per digit, per two digits
    assert {0} < set(lines) and sum(n == 0 for n in lines) > 30
    again = synthetic_examples("addition", 200, 5, TaskConfig(add_verbosity_weights=(1.0, 1.0, 1.0)))
    assert [e.completion for e in again] == [e.completion for e in mixed]


def test_the_longest_carry_chain_by_hand_and_problems_drawn_with_one():
    from workbench.data.tasks import longest_carry_chain

    # 999 + 1: every column carries; 95 + 5: the units and tens; 505 + 505 and 19 + 19: one column
    # each time; 123 + 456: none; 1 + 0: none (a column of one operand)
    cases = {(999, 1): 3, (95, 5): 2, (505, 505): 1, (19, 19): 1, (123, 456): 0, (1, 0): 0, (0, 0): 0}
    assert {ab: longest_carry_chain(*ab) for ab in cases} == cases
    for chain in (1, 2, 3):
        examples = synthetic_examples("addition", 40, 2, TaskConfig(add_carry_chain=chain))
        operands = [[int(x[::-1]) for x in e.prompt[3:].split("\n")[0].split("+")] for e in examples]
        assert {longest_carry_chain(a, b) for a, b in operands} == {chain}
    with pytest.raises(BadInput, match="add_carry_chain=4: expected 0 \\(any\\) to add_max_digits=3"):
        TaskConfig(add_carry_chain=4)


def test_addition_is_scored_by_the_number_after_the_marker():
    from workbench.data.tasks import addition_example

    ex = addition_example(957, 68, 2)
    assert ex.answer == "5201" and ex.text.endswith("#### 5201")
    assert is_correct(ex, " 75+86+0=52,1\n9+0+1=0,1\n#### 5201") and is_correct(ex, " #### 5201")
    assert not is_correct(ex, " 5201") and not is_correct(ex, " #### 520")


def test_flipflop_density_follows_its_weights_and_the_default_is_the_earlier_task():
    default = synthetic_examples("flipflop", 100, 0)
    explicit = synthetic_examples("flipflop", 100, 0, TaskConfig(flipflop_weights=(0.5, 0.2, 0.3)))
    assert [e.text for e in default] == [e.text for e in explicit]
    sparse = synthetic_examples(
        "flipflop", 300, 0, TaskConfig(flipflop_weights=(0.1, 0.8, 0.1), flipflop_min_len=20, flipflop_max_len=30)
    )
    # every instruction but the last query: a write (a1), an ignore (--) or an answered read (?a1)
    instructions = [i for e in sparse for i in re.findall(r"\?[a-h][01]|[a-h][01]|--", e.prompt[2:-2])]
    assert "".join(instructions) == "".join(e.prompt[2:-2] for e in sparse)
    assert 0.75 < instructions.count("--") / len(instructions) < 0.85


def test_a_three_weight_mix_is_the_earlier_mix_and_longer_mixes_add_the_new_tasks():
    from workbench.training.evaluate import eval_tasks

    old = synthetic_examples("mix", 200, 0, TaskConfig(mix_weights=(1, 6, 3)))
    padded = synthetic_examples("mix", 200, 0, TaskConfig(mix_weights=(1, 6, 3, 0, 0)))
    assert [e.text for e in old] == [e.text for e in padded]
    new = TaskConfig(mix_weights=(0, 1, 1, 2, 0))
    assert {e.task for e in synthetic_examples("mix", 200, 0, new)} == {"modsum", "flipflop", "perm"}
    assert eval_tasks("mix", new) == ["modsum", "flipflop", "perm"]
    assert eval_tasks("mix") == ["chain", "modsum", "flipflop"] and eval_tasks("perm", new) == ["perm"]


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("mix_weights", (1, 1), r"mix_weights=\(1\.0, 1\.0\): expected 3\.\.5 non-negative weights \(of chain, modsum"),
        ("mix_weights", (1, 1, 1, 1, 1, 1), r"mix_weights=.*expected 3\.\.5"),
        ("flipflop_weights", (1, 1, 0), r"flipflop_weights=\(1\.0, 1\.0, 0\.0\): expected a positive read weight"),
        ("flipflop_weights", (1, -1, 1), r"flipflop_weights=.*expected 3 non-negative weights \(of write, ignore, read\)"),
        ("perm_points", 5, r"perm_points=5: expected one of \[3, 4\]"),
        ("add_verbosity_weights", (0.0,), r"add_verbosity_weights=\(0\.0,\): expected 1\.\.9 .* positive sum"),
        ("add_max_digits", 65, r"add_max_digits=65: expected at most 64"),
    ],
)
def test_bad_task_settings_are_refused_by_name(field, value, match):
    with pytest.raises(BadInput, match=match):
        TaskConfig(**{field: value})


def test_perm_min_len_above_max_is_refused():
    with pytest.raises(BadInput, match="perm_min_len=9 > perm_max_len=8"):
        TaskConfig(perm_min_len=9)
