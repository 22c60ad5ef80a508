"""One problem of a task: what the tasks make and the answer rules judge (its own module, so that
``tasks`` and ``answers`` need not import each other)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Example:
    task: str
    prompt: str
    completion: str
    answer: str  # the exact-match target (chain: the number after ####)
    difficulty: int
    labels: dict[str, list[int]] = field(default_factory=dict)  # per character of text
    # characters of the prompt that answer something too (a flip-flop's earlier queries), scored
    # with the completion when training scores completions only (``data.loss_on=completion``)
    prompt_answers: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        return self.prompt + self.completion
