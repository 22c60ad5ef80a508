"""Tokenizers behind one small interface (``TokenizerBase``): encode, decode, the special ids, the
vocabulary size, save/load, and which characters of a text it cannot represent.

- ``CharTokenizer``: the workbench's character-level tokenizer, stored as a Hugging Face
  ``tokenizers`` JSON so an exported model loads with ``AutoTokenizer``. Ids: 0 <pad>, 1 <bos>,
  2 <eos>, 3 <unk>, then newline and the printable ASCII characters (100 ids, which fit every
  preset's d_vocab of 128).
- ``HFTokenizer``: any Hugging Face fast tokenizer (``tokenizer.json`` and ``tokenizer_config.json``,
  from a model directory, a GGUF file through ``transformers``, or a run directory).

``load_tokenizer(directory)`` reads whichever a run directory holds: ``tokenizer_config.json``
names the kind (``workbench_tokenizer``); runs written before it existed hold the character one.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import atomic_write, write_json

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
KIND_FIELD = "workbench_tokenizer"  # in tokenizer_config.json: "char" or "hf"


class TokenizerBase:
    """What every tokenizer offers. Subclasses set ``tokenizer`` (a ``tokenizers.Tokenizer``) and
    the special ids ``pad_id``, ``bos_id`` (None if there is none), ``eos_id``, ``unk_id`` (None)."""

    tokenizer: Tokenizer
    kind = ""
    pad_id: int
    bos_id: int | None
    eos_id: int
    unk_id: int | None
    chat_template: str | None = None  # a Jinja template, as Hugging Face instruct tokenizers carry

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of what decides the ids: the vocabulary, merges, normalisation and
        pre-tokenisation (the ``tokenizers`` JSON without its truncation and padding settings,
        keys sorted) and the special ids. Two tokenizers with the same fingerprint give the same
        ids for every text."""
        parts = {k: v for k, v in json.loads(self.tokenizer.to_str()).items() if k not in ("truncation", "padding")}
        spec = {
            "tokenizer": parts,
            "special_ids": [self.pad_id, self.bos_id, self.eos_id, self.unk_id],
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True, ensure_ascii=True).encode()).hexdigest()

    @property
    def id_limit(self) -> int:
        """One more than the largest id: a model needs d_vocab at least this."""
        return max(self.tokenizer.get_vocab().values()) + 1

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = self._encoding(text).ids
        return [self.bos_id, *ids] if (bos and self.bos_id is not None) else ids

    def _encoding(self, text: str):
        try:
            return self.tokenizer.encode(text, add_special_tokens=False)
        except TypeError as err:  # checked only on failure: encoding is on every hot path
            if isinstance(text, str):  # lone surrogates (undecodable argv bytes, a JSON "\udcff"): not text
                raise BadInput(f"text {text[:60]!r} is not valid Unicode text (it holds lone surrogates)") from err
            raise

    def encode_labelled(self, text: str, labels: dict[str, list[int]]) -> tuple[list[int], dict[str, list[int]]]:
        """``encode(text)`` and its per-token labels from per-character ``labels`` (-1: undefined).
        The alignment rule: a token takes the label of the character it ends at. A token that ends
        inside a character a later token also ends at (a byte of a multi-byte character) gets -1, as
        does a token ending past a label list's end; labels of characters no token ends at are not
        kept. For the character tokenizer this is the identity."""
        encoding = self._encoding(text)
        ends = [end for _, end in encoding.offsets]
        last = [j + 1 == len(ends) or ends[j + 1] != end for j, end in enumerate(ends)]
        aligned = {
            name: [values[end - 1] if (is_last and 0 < end <= len(values)) else -1 for end, is_last in zip(ends, last)]
            for name, values in labels.items()
        }
        return encoding.ids, aligned

    def decode(self, ids: Iterable, skip_special: bool = True) -> str:
        """Text of ``ids`` (ints, or a 1-d tensor of them)."""
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=skip_special)

    def roundtrips(self, text: str) -> bool:
        """Whether decoding the encoded ``text`` gives ``text`` back."""
        return self.decode(self.encode(text)) == text

    def lost_characters(self, text: str) -> dict[str, int]:
        """``{character: occurrences}`` for the characters of ``text`` this tokenizer cannot
        represent (encoded alone, the character does not decode back to itself, e.g. it becomes
        <unk>): what encoding ``text`` would lose. Empty when nothing is lost."""
        lost = {}
        for char in sorted(set(text)):
            if not self.roundtrips(char):
                lost[char] = text.count(char)
        return lost

    def encode_checked(self, text: str, bos: bool = False, where: str = "text") -> list[int]:
        """``encode``, refusing a text with characters the tokenizer cannot represent (named, counted)."""
        lost = self.lost_characters(text)
        if lost:
            shown = ", ".join(f"{c!r} x{n}" for c, n in list(lost.items())[:5])
            raise BadInput(
                f"{where} has {sum(lost.values())} characters the {self.kind} tokenizer cannot represent: {shown}"
                + (f" (and {len(lost) - 5} more kinds)" if len(lost) > 5 else "")
            )
        return self.encode(text, bos)

    def chat_prompt(self, prompt: str, where: str = "the tokenizer") -> str:
        """``prompt`` as a user's turn rendered by the chat template, with the assistant's turn
        opened: the text an instruct model was trained to continue. Rendered by ``transformers``
        (``apply_chat_template``), so it is the text Hugging Face tools would build."""
        if not self.chat_template:
            raise BadInput(f"{where} has no chat template: chat formatting is for instruct models' tokenizers")
        text = self._chat_renderer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        assert isinstance(text, str)  # tokenize=False renders text
        return text

    @functools.cached_property
    def _chat_renderer(self):
        """A ``transformers`` tokenizer around this one, made once (0.1 s for a 49k vocabulary)."""
        from transformers import PreTrainedTokenizerFast

        specials = {f"{name}_token": token for name, token in getattr(self, "special_tokens", {}).items()}
        return PreTrainedTokenizerFast(tokenizer_object=self.tokenizer, chat_template=self.chat_template, **specials)

    def silent_ids(self, d_vocab: int) -> frozenset[int]:
        """The ids below ``d_vocab`` that decode to the empty string: the special tokens and ids the
        vocabulary does not hold. A model can generate them and decoded text hides them, so tools
        count them instead (``Generation.silent_counts``)."""
        return frozenset(i for i in range(d_vocab) if self.decode([i]) == "")

    def save(self, directory: str | Path, model_max_length: int | None = None) -> None:
        """Write ``tokenizer.json`` and a ``tokenizer_config.json`` that ``AutoTokenizer`` reads,
        each atomically (a run directory's files are rewritten at every checkpoint)."""
        directory = Path(directory)
        atomic_write(directory / "tokenizer.json", lambda tmp: self.tokenizer.save(str(tmp)))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.config_fields(), KIND_FIELD: self.kind}
        if model_max_length is not None:
            config["model_max_length"] = model_max_length
        write_json(directory / "tokenizer_config.json", config)

    def config_fields(self) -> dict:
        raise NotImplementedError


class CharTokenizer(TokenizerBase):
    kind = "char"

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

    def config_fields(self) -> dict:
        return {
            "pad_token": "<pad>",
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "unk_token": "<unk>",
            "clean_up_tokenization_spaces": False,
        }

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        """The character tokenizer saved in ``directory`` (see ``load_tokenizer``)."""
        tokenizer = load_tokenizer(directory)
        if not isinstance(tokenizer, cls):
            raise BadInput(f"{Path(directory) / 'tokenizer.json'} holds a {tokenizer.kind} tokenizer, not the character one")
        return tokenizer


SPECIAL_NAMES = ("bos", "eos", "pad", "unk")


class HFTokenizer(TokenizerBase):
    """A Hugging Face fast tokenizer with the special tokens its ``tokenizer_config.json`` names
    (no pad token: pad with eos, as Llama-family models do) and its chat template, if any."""

    kind = "hf"

    def __init__(self, tokenizer: Tokenizer, config: dict, source: str = "tokenizer"):
        self.tokenizer = tokenizer
        names = {name: _token_name(config.get(f"{name}_token")) for name in SPECIAL_NAMES}
        ids = {name: (tokenizer.token_to_id(token) if token else None) for name, token in names.items()}
        unknown = [f"{name}_token {names[name]!r}" for name in SPECIAL_NAMES if names[name] and ids[name] is None]
        if unknown:
            raise BadInput(f"{source} names special tokens its vocabulary lacks: {', '.join(unknown)}")
        eos = ids["eos"]
        if eos is None:
            raise BadInput(f"{source} names no eos_token: generation could not stop")
        self.special_tokens = {name: token for name, token in names.items() if token}
        self.bos_id, self.eos_id, self.unk_id = ids["bos"], eos, ids["unk"]
        self.pad_id = ids["pad"] if ids["pad"] is not None else eos
        template = config.get("chat_template")
        self.chat_template: str | None = template if isinstance(template, str) else None

    @classmethod
    def from_directory(cls, directory: str | Path) -> HFTokenizer:
        """The tokenizer of a Hugging Face model directory (``tokenizer.json``, ``tokenizer_config.json``)."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise MissingFile(f"no tokenizer at {path} (a Hugging Face fast tokenizer is expected there)")
        return cls(_read_tokenizer(path), _read_config(directory), str(path))

    @classmethod
    def from_transformers(cls, tok, source: str = "tokenizer") -> HFTokenizer:
        """From a ``transformers`` fast tokenizer (e.g. ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``)."""
        config = {f"{name}_token": getattr(tok, f"{name}_token", None) for name in SPECIAL_NAMES}
        config["chat_template"] = getattr(tok, "chat_template", None)
        return cls(tok.backend_tokenizer, config, source)

    def config_fields(self) -> dict:
        fields: dict = {f"{name}_token": token for name, token in self.special_tokens.items()}
        if self.chat_template is not None:
            fields["chat_template"] = self.chat_template
        return {**fields, "clean_up_tokenization_spaces": False}


def load_tokenizer(directory: str | Path) -> TokenizerBase:
    """The tokenizer saved in a run (or exported) directory: the kind its ``tokenizer_config.json``
    names (none named: the character tokenizer, which every earlier run holds). When a model's
    ``config.json`` is there too, the tokenizer's ids must fit the model's d_vocab."""
    directory = Path(directory)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise MissingFile(f"no tokenizer at {path}")
    config = _read_config(directory)
    kind = config.get(KIND_FIELD, "char")
    if kind not in ("char", "hf"):
        raise BadInput(f"{directory / 'tokenizer_config.json'}: {KIND_FIELD}={kind!r}: expected 'char' or 'hf'")
    raw = _read_tokenizer(path)
    try:
        tokenizer: TokenizerBase = CharTokenizer(raw) if kind == "char" else HFTokenizer(raw, config)
    except BadInput as err:  # the vocabulary does not hold what the kind needs
        raise BadInput(f"corrupt tokenizer file {path}: {err}") from err
    model_config = directory / "config.json"
    d_vocab = _model_d_vocab(model_config)
    if d_vocab is not None and tokenizer.id_limit > d_vocab:
        raise BadInput(
            f"tokenizer {path} does not match the model in {model_config}: it has ids up to "
            f"{tokenizer.id_limit - 1}, the model's d_vocab is {d_vocab}"
        )
    return tokenizer


def tokenizer_of(run: str | Path) -> TokenizerBase:
    """The tokenizer a run directory holds; the character tokenizer for what is not one (a fresh
    ``ARCH:PRESET`` model, which is made for it)."""
    path = Path(run)
    return load_tokenizer(path) if (path / "tokenizer.json").is_file() else CharTokenizer()


def _token_name(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_tokenizer(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise BadInput(f"corrupt tokenizer file {path}: {err}") from err


def _read_config(directory: Path) -> dict:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise BadInput(f"corrupt tokenizer config {path}: {err}") from err
    if not isinstance(config, dict):
        raise BadInput(f"corrupt tokenizer config {path}: expected a JSON object, got {type(config).__name__}")
    return config


def _model_d_vocab(config: Path) -> int | None:
    """d_vocab of the model config beside a tokenizer, if there is a readable one (``load_model``
    reports a broken config; this check only needs the number)."""
    try:
        d_vocab = json.loads(config.read_text())["model"]["d_vocab"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return d_vocab if isinstance(d_vocab, int) and not isinstance(d_vocab, bool) else None
