"""Long documents tokenized in pieces whose tokens, concatenated, are the whole document's: memory
for tokenizing one document stays bounded whatever its length (``piece_bounds``)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from workbench.runtime.tokenizer import TokenizerBase
from workbench.storage.errors import BadInput

PIECE_CHARS = 1 << 16  # a longer document is tokenized in pieces of at most this many characters
PIECE_CHECK = 256  # characters each side of a cut that are tokenized whole and in two to check it
_CUT = re.compile(r"(?<=\S)\s")  # whitespace after non-whitespace: where whitespace-splitting pre-tokenizers end a word


def piece_bounds(text: str, tokenizer: TokenizerBase, where: str = "text") -> Iterator[tuple[int, int]]:
    """(start, end) of the pieces, at most ``PIECE_CHARS`` characters each, that a long document is
    tokenized in, chosen so that the pieces' tokens, concatenated, are the whole document's. The
    character tokenizer (one token per character) is cut anywhere; another tokenizer before a
    whitespace character that follows a non-whitespace one, where pre-tokenizers that split at
    whitespace (GPT-2's byte-level rule, Metaspace) end a word, so no token spans the cut. Each cut
    is also checked, since a tokenizer may not split there: the ``PIECE_CHECK`` characters each side
    must tokenize the same whole and in two, else an earlier place is tried; ``where`` names the
    document in the error when none of 16 passes."""
    start = 0
    while len(text) - start > PIECE_CHARS:
        limit = start + PIECE_CHARS
        candidates = [limit] if tokenizer.kind == "char" else []
        candidates += _whitespace_cuts(text, start, limit)
        tried = candidates[:16]
        cut = next((c for c in tried if _cuts_cleanly(tokenizer, text, c)), None)
        if cut is None:
            why = (
                f"the {tokenizer.kind} tokenizer splits it differently at each of the {len(tried)} whitespace cuts tried"
                if tried
                else "there is no whitespace after a word to cut at"
            )
            raise BadInput(
                f"{where}: a document of {len(text):,} characters is tokenized in pieces of at most {PIECE_CHARS:,}, "
                f"but in characters {start:,}-{limit:,} {why}; split it into shorter documents"
            )
        yield start, cut
        start = cut
    yield start, len(text)


def _whitespace_cuts(text: str, start: int, limit: int, wanted: int = 16) -> list[int]:
    """Up to ``wanted`` places in (start, limit] before whitespace that follows a word, last first;
    searched backwards a few thousand characters at a time, as the last ones are nearly always enough."""
    found: list[int] = []
    end = limit + 1
    while end > start + 1 and len(found) < wanted:
        begin = max(start + 1, end - 4096)
        found += reversed([m.start() for m in _CUT.finditer(text, begin, end)])
        end = begin
    return found[:wanted]


def _cuts_cleanly(tokenizer: TokenizerBase, text: str, cut: int) -> bool:
    begin, end = max(cut - PIECE_CHECK, 0), cut + PIECE_CHECK
    left, right, whole = tokenizer.tokenizer.encode_batch(
        [text[begin:cut], text[cut:end], text[begin:end]], add_special_tokens=False
    )
    return left.ids + right.ids == whole.ids
