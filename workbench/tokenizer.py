"""Character-level tokenizer, stored as a Hugging Face ``tokenizers`` JSON so an exported model
loads with ``AutoTokenizer``. Ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk>, then newline and the
printable ASCII characters (100 ids, which fit every preset's d_vocab of 128)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

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
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (tokenizer.token_to_id(t) for t in SPECIALS)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=skip_special)

    def save(self, directory: str | Path, model_max_length: int | None = None) -> None:
        """Write ``tokenizer.json`` and a ``tokenizer_config.json`` that ``AutoTokenizer`` reads."""
        directory = Path(directory)
        self.tokenizer.save(str(directory / "tokenizer.json"))
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
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> "CharTokenizer":
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer at {path}")
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
            raise ValueError(f"corrupt tokenizer file {path}: {err}") from err
