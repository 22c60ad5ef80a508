"""Character-level tokenizer, stored as a Hugging Face ``tokenizers`` JSON so an exported model
loads with ``AutoTokenizer``. Ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk>, then newline and the
printable ASCII characters (100 ids, which fit every preset's d_vocab of 128)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import atomic_write, write_json

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


class CharTokenizer:
    def __init__(self, tokenizer: Tokenizer | None = None):
        if tokenizer is None:
            vocab = {tok: i for i, tok in enumerate(SPECIALS + tuple(CHARS))}
            tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
            tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
            tokenizer.decoder = decoders.Fuse()
            tokenizer.add_special_tokens(list(SPECIALS))
        self.tokenizer = tokenizer
        missing = [t for t in SPECIALS if tokenizer.token_to_id(t) is None]
        if missing:
            raise BadInput(f"the tokenizer has no special token {missing[0]!r} (it needs {list(SPECIALS)})")
        # tools pad with id 0 and stop at id 2, and an id must decode to one token only
        misplaced = [f"{t} is id {tokenizer.token_to_id(t)}" for i, t in enumerate(SPECIALS) if tokenizer.token_to_id(t) != i]
        if misplaced:
            raise BadInput(
                f"special tokens must be at ids {', '.join(f'{i} {t}' for i, t in enumerate(SPECIALS))}: " + ", ".join(misplaced)
            )
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = range(len(SPECIALS))  # the ids checked above
        tokens_of: dict[int, list[str]] = {}
        for token, i in sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0])):
            tokens_of.setdefault(i, []).append(token)
        shared = [f"id {i} <- {tokens!r}" for i, tokens in tokens_of.items() if len(tokens) > 1]
        if shared:
            more = f" (and {len(shared) - 3} more)" if len(shared) > 3 else ""
            raise BadInput(f"the vocabulary maps several tokens to one id: {'; '.join(shared[:3])}{more}")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=skip_special)

    def silent_ids(self, d_vocab: int) -> frozenset[int]:
        """The ids below ``d_vocab`` that decode to the empty string: the special tokens and ids the
        vocabulary does not hold. A model can generate them and decoded text hides them, so tools
        count them instead (``Generation.silent_counts``)."""
        return frozenset(i for i in range(d_vocab) if self.decode([i]) == "")

    @property
    def id_limit(self) -> int:
        """One more than the largest id: a model needs d_vocab at least this."""
        return max(self.tokenizer.get_vocab().values()) + 1

    def save(self, directory: str | Path, model_max_length: int | None = None) -> None:
        """Write ``tokenizer.json`` and a ``tokenizer_config.json`` that ``AutoTokenizer`` reads,
        each atomically (a run directory's files are rewritten at every checkpoint)."""

        directory = Path(directory)
        atomic_write(directory / "tokenizer.json", lambda tmp: self.tokenizer.save(str(tmp)))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "pad_token": "<pad>",
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "unk_token": "<unk>",
            "clean_up_tokenization_spaces": False,
        }
        if model_max_length is not None:
            config["model_max_length"] = model_max_length
        write_json(directory / "tokenizer_config.json", config)

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        """The tokenizer saved in ``directory``; when a model's ``config.json`` is there too, its
        ids must fit the model's d_vocab."""
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise MissingFile(f"no tokenizer at {path}")
        try:
            tokenizer = cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
            raise BadInput(f"corrupt tokenizer file {path}: {err}") from err
        config = Path(directory) / "config.json"
        d_vocab = _model_d_vocab(config)
        if d_vocab is not None and tokenizer.id_limit > d_vocab:
            raise BadInput(
                f"tokenizer {path} does not match the model in {config}: it has ids up to "
                f"{tokenizer.id_limit - 1}, the model's d_vocab is {d_vocab}"
            )
        return tokenizer


def _model_d_vocab(config: Path) -> int | None:
    """d_vocab of the model config beside a tokenizer, if there is a readable one (``load_model``
    reports a broken config; this check only needs the number)."""
    try:
        d_vocab = json.loads(config.read_text())["model"]["d_vocab"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return d_vocab if isinstance(d_vocab, int) and not isinstance(d_vocab, bool) else None
