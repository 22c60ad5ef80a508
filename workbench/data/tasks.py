"""Tasks: synthetic problems generated offline and deterministically from a seed, each with
per-character labels for probing, plus local GSM8K-format JSONL, plain text, and Hugging Face
datasets by name.

Every example is one line of work for a character-level model: ``text = prompt + completion``.
Labels are per character of ``text`` (the tokenizer is character-level, so per token too); -1
where a label is undefined.

- ``chain``: chained arithmetic of 1..max_steps steps, GSM8K-format answer (``<<a+b=c>>`` steps,
  final ``#### N``); ``merge`` steps are written per line (1: every step, max_steps: one line), so
  one problem has traces of different lengths. Difficulty = number of steps. Label ``value``: the
  running result once a step's result has been written.
- ``modsum``: a digit string whose answer is its sum mod p. Label ``running_sum``: the sum so far.
- ``flipflop``: a k-bit flip-flop (``a1`` set channel a, ``b0`` reset b, ``--`` no-op, ``?c``
  query c, answered by the next character), instructions drawn write : ignore : read as
  ``flipflop_weights`` (Liu et al. 2023 train at one ignore density and test at others). Label
  ``memory``: the memory state as a bitmask.
- ``perm``: a running product of permutations of ``perm_points`` points (S3: 6 letters, S4: 24),
  answered by the product (Merrill et al.'s state-tracking task). Label ``perm_state``: the
  product so far.
- ``addition``: two numbers written least significant digit first, answered by their sum (also
  reversed) after a scratchpad whose verbosity is drawn per problem from
  ``add_verbosity_weights`` (none, one line per digit, one per two digits, ...). Difficulty = the
  longer operand's digits; ``add_carry_chain`` draws only problems whose longest run of columns
  that carry has that length. Label ``carry``: the carry into the digit being written.
- ``mix``: a weighted mixture of them (``mix_weights``, in the order of ``SYNTHETIC``).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from workbench.data.answers import parse_final_answer
from workbench.data.example import Example
from workbench.runtime.config import check_section
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import parse_json

SYNTHETIC = ("chain", "modsum", "flipflop", "perm", "addition")
TASK_KINDS = SYNTHETIC + ("mix",)
LABELS = {
    "chain": ("value",),
    "modsum": ("running_sum",),
    "flipflop": ("memory",),
    "perm": ("perm_state",),
    "addition": ("carry",),
}


MAX_EXAMPLES = 1_000_000  # synthetic examples of one call
LIMITS = {
    "chain_max_steps": 64,
    "chain_merge": 64,
    "chain_max_operand": 10**6,
    "modsum_min_len": 4096,
    "modsum_max_len": 4096,
    "flipflop_min_len": 4096,
    "flipflop_max_len": 4096,
    "perm_max_len": 4096,
    "add_max_digits": 64,
}


# the weight fields of ``TaskConfig``: (fewest, most, what they weigh)
WEIGHTS = {
    "mix_weights": (3, len(SYNTHETIC), f"3..{len(SYNTHETIC)} non-negative weights (of {', '.join(SYNTHETIC)})"),
    "flipflop_weights": (3, 3, "3 non-negative weights (of write, ignore, read)"),
    "add_verbosity_weights": (1, 9, "1..9 non-negative weights (of no scratchpad, one line per digit, per two, ...)"),
}

# the elements of S_n in lexicographic order (index 0 the identity), one letter each
PERMUTATIONS = {n: list(itertools.permutations(range(n))) for n in (3, 4)}


@dataclass
class TaskConfig:
    """Parameters of the synthetic tasks (the ``data.*`` overrides)."""

    chain_max_steps: int = 4
    chain_merge: int = 1  # steps written per answer line (verbosity: 1 = every step)
    # mixed verbosity: weights of writing 1, 2, ... steps in one answer line, drawn line by line
    # (from the problem itself, so the problems are those of any fixed verbosity); () = chain_merge
    chain_merge_weights: tuple[float, ...] = ()
    chain_max_operand: int = 20
    modsum_p: int = 7
    modsum_min_len: int = 4
    modsum_max_len: int = 16
    flipflop_bits: int = 3
    flipflop_min_len: int = 6
    flipflop_max_len: int = 16
    flipflop_weights: tuple[float, ...] = (0.5, 0.2, 0.3)  # write, ignore, read
    perm_points: int = 3  # S3 (6 elements); 4: S4 (24)
    perm_min_len: int = 2
    perm_max_len: int = 8
    add_min_digits: int = 1
    add_max_digits: int = 3
    # weights of a problem's scratchpad: none, one line per digit, one per two digits, ...
    add_verbosity_weights: tuple[float, ...] = (0.0, 1.0)
    add_carry_chain: int = 0  # the longest run of carrying columns of every problem; 0: any
    # chain, modsum, flipflop, perm, addition (``SYNTHETIC``); a shorter tuple weighs the rest 0
    mix_weights: tuple[float, ...] = (1.0, 1.0, 1.0)

    def __post_init__(self) -> None:
        check_section(self)
        for f in dataclasses.fields(TaskConfig):
            value = getattr(self, f.name)
            if f.name in WEIGHTS:
                value = tuple(float(w) for w in value)
                setattr(self, f.name, value)
                low, high, what = WEIGHTS[f.name]
                if not low <= len(value) <= high or any(not w >= 0 for w in value) or not 0 < sum(value) < float("inf"):
                    raise BadInput(f"data field {f.name}={value!r}: expected {what} with a positive sum")
            elif f.name == "chain_merge_weights":
                value = tuple(float(w) for w in value)
                self.chain_merge_weights = value
                if value and (len(value) > 8 or any(not w >= 0 for w in value) or not 0 < sum(value) < float("inf")):
                    raise BadInput(
                        f"data field chain_merge_weights={value!r}: expected () or 1..8 non-negative weights "
                        "(of writing 1, 2, ... steps per line) with a positive sum"
                    )
            elif f.name == "add_carry_chain":
                if not isinstance(value, int) or not 0 <= value <= self.add_max_digits:
                    raise BadInput(
                        f"data field add_carry_chain={value!r}: expected 0 (any) to add_max_digits={self.add_max_digits}"
                    )
            elif not isinstance(value, int) or value < 1:
                raise BadInput(f"data field {f.name}={value!r}: expected an integer >= 1")
        if not 2 <= self.modsum_p <= 10:
            raise BadInput(f"data field modsum_p={self.modsum_p}: expected 2..10 (a one-digit answer)")
        if self.flipflop_bits > 8:
            raise BadInput(f"data field flipflop_bits={self.flipflop_bits}: expected at most 8 channels")
        if self.flipflop_weights[2] <= 0:
            raise BadInput(f"data field flipflop_weights={self.flipflop_weights!r}: expected a positive read weight (the last)")
        if self.perm_points not in PERMUTATIONS:
            raise BadInput(f"data field perm_points={self.perm_points}: expected one of {sorted(PERMUTATIONS)} (S3, S4)")
        for name, top in LIMITS.items():  # an example must stay a sequence a model can read
            if getattr(self, name) > top:
                raise BadInput(f"data field {name}={getattr(self, name)}: expected at most {top}")
        for lo, hi in (
            ("modsum_min_len", "modsum_max_len"),
            ("flipflop_min_len", "flipflop_max_len"),
            ("perm_min_len", "perm_max_len"),
            ("add_min_digits", "add_max_digits"),
        ):
            if getattr(self, lo) > getattr(self, hi):
                raise BadInput(f"data fields {lo}={getattr(self, lo)} > {hi}={getattr(self, hi)}")


# ---- chain ---------------------------------------------------------------------------------

_WORDS = {"+": "Add", "-": "Subtract", "*": "Multiply by"}


def chain_steps(rng: random.Random, n_steps: int, max_operand: int) -> tuple[int, list[tuple[str, int]]]:
    start = rng.randint(1, max_operand)
    value, steps = start, []
    for _ in range(n_steps):
        op = rng.choice("+-*")
        if op == "*" and value * 4 > 999:
            op = "-"
        if op == "-" and value < 2:
            op = "+"
        b = {
            "+": rng.randint(1, max_operand),
            "-": rng.randint(1, min(value - 1, max_operand)) if op == "-" else 0,
            "*": rng.randint(2, 4),
        }[op]
        value = _apply(value, op, b)
        steps.append((op, b))
    return start, steps


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def merge_sizes(start: int, steps: list[tuple[str, int]], weights: tuple[float, ...]) -> list[int]:
    """How many steps each answer line writes, drawn line by line from ``weights`` (of 1, 2, ...
    steps) with a generator seeded by the problem itself: the same problem is always written the
    same way, and drawing takes nothing from the stream the problems come from."""
    rng = random.Random(f"chain-merge|{start}|{steps}")
    sizes, left = [], len(steps)
    while left:
        size = min(rng.choices(range(1, len(weights) + 1), weights)[0], left)
        sizes.append(size)
        left -= size
    return sizes


def chain_example(start: int, steps: list[tuple[str, int]], merge: int | list[int]) -> Example:
    """The problem and its GSM8K-style answer; ``merge``: steps per answer line, one number for
    every line or one per line (summing to the number of steps)."""
    question = f"Start with {start}. " + " ".join(f"{_WORDS[op]} {b}." for op, b in steps) + " What is the result?"
    prompt = f"Q: {question}\nA:"
    sizes = merge if isinstance(merge, list) else [merge] * -(-len(steps) // merge)
    bounds = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
    lines, values = [], []
    value = start
    for i, end in zip(bounds, bounds[1:]):
        expr = str(value)
        for j, (op, b) in enumerate(steps[i:end]):
            expr = f"({expr}){op}{b}" if j > 0 and op == "*" and any(o != "*" for o, _ in steps[i : i + j]) else f"{expr}{op}{b}"
            value = _apply(value, op, b)
        lines.append(f"{expr}=<<{expr}={value}>>{value}")
        values.append(value)
    completion = " " + "\n".join(lines) + f"\n#### {value}"
    text = prompt + completion
    label = [-1] * len(text)
    pos, current = len(prompt), -1
    for line, v in zip(lines, values):  # the value becomes known once the line's result is written
        start_at = text.index(line, pos)
        end = start_at + len(line)
        for t in range(pos, end):
            label[t] = current
        current, pos = v, end
    for t in range(pos, len(text)):
        label[t] = current
    return Example("chain", prompt, completion, str(value), len(steps), {"value": label})


def make_chain(rng: random.Random, cfg: TaskConfig, n_steps: int | None = None) -> Example:
    n_steps = n_steps or rng.randint(1, cfg.chain_max_steps)
    start, steps = chain_steps(rng, n_steps, cfg.chain_max_operand)
    merge = merge_sizes(start, steps, cfg.chain_merge_weights) if cfg.chain_merge_weights else cfg.chain_merge
    return chain_example(start, steps, merge)


# ---- modsum, flipflop ----------------------------------------------------------------------


def make_modsum(rng: random.Random, cfg: TaskConfig) -> Example:
    digits = [rng.randint(0, 9) for _ in range(rng.randint(cfg.modsum_min_len, cfg.modsum_max_len))]
    prompt = "S:" + "".join(map(str, digits)) + "="
    total, running = 0, [0, 0]
    for d in digits:
        total = (total + d) % cfg.modsum_p
        running.append(total)
    completion = str(total)
    running += [total, total]  # "=" and the answer
    return Example("modsum", prompt, completion, completion, len(digits), {"running_sum": running})


def make_flipflop(rng: random.Random, cfg: TaskConfig) -> Example:
    channels = "abcdefgh"[: cfg.flipflop_bits]
    memory, text, labels, answered = 0, "F:", [0, 0], []
    n = rng.randint(cfg.flipflop_min_len, cfg.flipflop_max_len)
    for i in range(n):
        last = i == n - 1
        kind = "query" if last else rng.choices(("write", "noop", "query"), cfg.flipflop_weights)[0]
        c = rng.randrange(len(channels))
        if kind == "write":
            bit = rng.randint(0, 1)
            before = memory
            memory = memory | (1 << c) if bit else memory & ~(1 << c)
            text += f"{channels[c]}{bit}"
            labels += [before, memory]  # the new state is known once the bit is read
        elif kind == "noop":
            text += "--"
            labels += [memory, memory]
        else:
            answer = str((memory >> c) & 1)
            if last:
                prompt = text + f"?{channels[c]}"
                labels += [memory, memory, memory]
                return Example("flipflop", prompt, answer, answer, n, {"memory": labels}, tuple(answered))
            answered.append(len(text) + 2)
            text += f"?{channels[c]}{answer}"
            labels += [memory, memory, memory]
    raise AssertionError("unreachable: the last instruction is a query")


# ---- perm, addition ------------------------------------------------------------------------


def compose(first: tuple[int, ...], then: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that applies ``first``, then ``then``: x -> then[first[x]]."""
    return tuple(then[x] for x in first)


def make_perm(rng: random.Random, cfg: TaskConfig) -> Example:
    elements = PERMUTATIONS[cfg.perm_points]
    index = {g: i for i, g in enumerate(elements)}
    n = rng.randint(cfg.perm_min_len, cfg.perm_max_len)
    drawn = [rng.randrange(len(elements)) for _ in range(n)]
    state, states = elements[0], [0, 0]  # "P:" sees the identity
    for i in drawn:
        state = compose(state, elements[i])
        states.append(index[state])
    answer = chr(ord("a") + index[state])
    states += [index[state], index[state]]  # "=" and the answer
    prompt = "P:" + "".join(chr(ord("a") + i) for i in drawn) + "="
    return Example("perm", prompt, answer, answer, n, {"perm_state": states})


def scratchpad_verbosity(a: int, b: int, weights: tuple[float, ...]) -> int:
    """Digits per scratchpad line (0: none) of the problem ``a + b``, drawn from ``weights`` with a
    generator seeded by the problem itself: drawing takes nothing from the problems' stream."""
    return random.Random(f"addition-verbosity|{a}|{b}").choices(range(len(weights)), weights)[0]


def addition_example(a: int, b: int, verbosity: int) -> Example:
    """``a + b`` with digits least significant first, and a scratchpad of one line per
    ``verbosity`` digits (0: none): ``<a's digits>+<b's digits>+<carry in>=<sum's digits>,<carry
    out>``, each chunk least significant first and the shorter operand padded with zeros."""
    width = max(len(str(a)), len(str(b)))
    ra, rb = str(a)[::-1].ljust(width, "0"), str(b)[::-1].ljust(width, "0")
    total = str(a + b)[::-1]
    prompt = f"Q: {str(a)[::-1]}+{str(b)[::-1]}\nA:"
    lines, carries, carry = [], [], 0  # carries: the carry into each line
    for start in range(0, width, verbosity) if verbosity else ():
        ca, cb = ra[start : start + verbosity], rb[start : start + verbosity]
        s = int(ca[::-1]) + int(cb[::-1]) + carry
        digits = str(s % 10 ** len(ca)).rjust(len(ca), "0")[::-1]
        lines.append(f"{ca}+{cb}+{carry}={digits},{s // 10 ** len(ca)}")
        carries.append(carry)
        carry = s // 10 ** len(ca)
    completion = " " + "".join(line + "\n" for line in lines) + f"#### {total}"
    text = prompt + completion
    label = [-1] * len(text)
    pos = len(prompt) + 1
    for line, c in zip(lines, carries):
        label[pos : pos + len(line)] = [c] * len(line)
        pos += len(line) + 1
    carry, pos = 0, len(text) - len(total)
    for j in range(len(total)):  # the carry into answer digit j
        label[pos + j] = carry
        column = (int(ra[j]) + int(rb[j]) if j < width else 0) + carry
        carry = column // 10
    return Example("addition", prompt, completion, total, width, {"carry": label})


def longest_carry_chain(a: int, b: int) -> int:
    """The longest run of consecutive columns of ``a + b`` that carry into the next."""
    longest = run = carry = 0
    while a or b:
        carry = (a % 10 + b % 10 + carry) // 10
        run = run + 1 if carry else 0
        longest = max(longest, run)
        a, b = a // 10, b // 10
    return longest


CARRY_TRIES = 100_000  # draws for one problem with the asked carry chain; past them it is refused as too rare


def make_addition(rng: random.Random, cfg: TaskConfig, digits: int | None = None) -> Example:
    """Operands of ``add_min_digits``..``add_max_digits`` digits each; with ``digits``, the first
    has exactly that many and the second at most that many (a trace study's difficulty). With
    ``add_carry_chain``, problems are drawn until one has that longest carry chain."""
    for _ in range(CARRY_TRIES if cfg.add_carry_chain else 1):
        if digits is None:
            a, b = (rng.randrange(10 ** (rng.randint(cfg.add_min_digits, cfg.add_max_digits))) for _ in range(2))
        else:
            a, b = rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits), rng.randrange(10**digits)
        if not cfg.add_carry_chain or longest_carry_chain(a, b) == cfg.add_carry_chain:
            return addition_example(a, b, scratchpad_verbosity(a, b, cfg.add_verbosity_weights))
    raise BadInput(f"data field add_carry_chain={cfg.add_carry_chain}: no problem of {CARRY_TRIES} drawn had it")


# What a prompt of each synthetic task starts with, to say which task a prompt given by hand is
# (addition before the looser GSM8K-style frame of chain and the files).
PROMPT_FORMS = {
    "chain": re.compile(r"Q: Start with \d+\."),
    "addition": re.compile(r"Q: \d+\+\d+\s*(\nA:|$)"),
    "modsum": re.compile(r"S:\d*(=|$)"),
    "flipflop": re.compile(r"F:([a-h][01]|--|\?[a-h][01]?)*$"),
    "perm": re.compile(r"P:[a-x]*(=|$)"),
}


def task_of_prompt(prompt: str) -> str | None:
    """The synthetic task whose problems ``prompt`` is written as, or None (any other text)."""
    text = prompt.strip()
    return next((task for task, form in PROMPT_FORMS.items() if form.match(text)), None)


MAKERS = {"chain": make_chain, "modsum": make_modsum, "flipflop": make_flipflop, "perm": make_perm, "addition": make_addition}


SPLITS = ("train", "heldout", "validation")


def split_rng(stream: str, seed: int, split: str = "train") -> random.Random:
    """The random stream ``stream`` (a task, or a study's own name) for ``seed``. ``train`` is
    seeded with ``"{stream}:{seed}"``, as every run so far was; ``heldout`` with
    ``"{stream}:heldout:{seed}"``, a string no training stream of any seed has, so held-out
    problems are independent of every training seed's (not a training seed shifted by an offset);
    ``validation`` (what a tuning sweep scores, neither training data nor test problems) with
    ``"{stream}:validation:{seed}"``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: expected one of {SPLITS}")
    return random.Random(f"{stream}:{seed}" if split == "train" else f"{stream}:{split}:{seed}")


def synthetic_examples(task: str, n: int, seed: int, cfg: TaskConfig | None = None, split: str = "train") -> list[Example]:
    """``n`` examples of ``task`` (``chain``, ``modsum``, ``flipflop`` or ``mix``), the same for the
    same seed and split on every machine. ``split="heldout"`` draws from the held-out stream
    (``workbench.data.splits.heldout_examples``)."""
    cfg = cfg or TaskConfig()
    if task not in TASK_KINDS:
        raise BadInput(f"unknown task {task!r}: expected one of {TASK_KINDS} or jsonl:PATH, text:PATH, hf:NAME")
    if not 0 <= n <= MAX_EXAMPLES:
        raise BadInput(f"{n} {task} examples requested: expected 0..{MAX_EXAMPLES:,} (they are generated in memory)")
    rng = split_rng(task, seed, split)
    out = []
    for _ in range(n):
        kind = rng.choices(SYNTHETIC[: len(cfg.mix_weights)], cfg.mix_weights)[0] if task == "mix" else task
        out.append(MAKERS[kind](rng, cfg))
    return out


# ---- GSM8K format and other sources --------------------------------------------------------


def gsm8k_example(question: str, answer: str) -> Example:
    final = parse_final_answer(answer)
    steps = answer.count("<<")
    return Example("gsm8k", f"Q: {question}\nA:", " " + answer, final or "", max(steps, 1))


def load_jsonl(path: str | Path) -> list[Example]:
    """GSM8K-format JSONL (``question``, ``answer`` per line)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"no JSONL file at {path}")
    out = []
    for i, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        row = parse_json(line, f"{path}:{i}")
        if not isinstance(row, dict) or not {"question", "answer"} <= set(row):
            raise BadInput(f"{path}:{i}: expected an object with 'question' and 'answer'")
        out.append(gsm8k_example(str(row["question"]), str(row["answer"])))
    return out


def load_text(path: str | Path, chunk: int = 512) -> list[Example]:
    """Plain text, cut into chunks of ``chunk`` characters (no prompt, no labels)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"no text file at {path}")
    text = _read_text(path)
    return [Example("text", "", text[i : i + chunk], "", 1) for i in range(0, len(text), chunk)]


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError as err:
        raise BadInput(f"{path} is not UTF-8 text: {err}") from err


def load_hf(name: str, config: str | None = None, split: str = "train") -> list[Example]:
    """A Hugging Face dataset by name (needs the network); GSM8K-format columns become problems,
    a ``text`` column becomes plain text."""
    import datasets

    try:
        rows = cast(datasets.Dataset, datasets.load_dataset(name, config, split=split))  # one split
    except Exception as err:  # datasets raises many kinds when offline
        raise BadInput(f"could not load Hugging Face dataset {name!r} ({config}, {split}): {err}") from err
    if {"question", "answer"} <= set(rows.column_names):
        return [gsm8k_example(r["question"], r["answer"]) for r in rows.to_list()]
    if "text" in rows.column_names:
        return [Example("text", "", r["text"], "", 1) for r in rows.to_list()]
    raise BadInput(f"dataset {name!r} has neither question/answer nor text columns: {rows.column_names}")


def load_task(spec: str, n: int, seed: int, cfg: TaskConfig | None = None) -> list[Example]:
    """Examples for a task spec: a synthetic task name, ``jsonl:PATH``, ``text:PATH`` or
    ``hf:NAME[:CONFIG]``. File-backed sources ignore ``n`` and ``seed``."""
    kind, _, rest = spec.partition(":")
    if kind == "jsonl" and rest:
        return load_jsonl(rest)
    if kind == "text" and rest:
        return load_text(rest)
    if kind == "hf" and rest:
        name, _, config = rest.partition(":")
        return load_hf(name, config or None)
    return synthetic_examples(spec, n, seed, cfg)
