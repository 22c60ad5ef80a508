"""A GGUF file's header read within bounds before any parser of its own reads it: the gguf
package builds Python objects per array element and numpy views per tensor, so a small file that
declares millions of strings or tensors takes gigabytes before anything is checked.

Layout (GGUF v2 and v3): ``GGUF``, version (u32), tensor count (u64), key/value count (u64); each
key/value: a string key, a value type (u32) and the value (an array: element type u32, count u64,
elements); each tensor: a string name, dimension count (u32), dimensions (u64 each), type (u32),
offset (u64). A string is a u64 length and its bytes. Everything is little-endian.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import BinaryIO

from workbench.storage.errors import BadInput

MAX_ARRAY = 1 << 20  # elements of one metadata array (the largest vocabularies and merge lists are under 300,000)
MAX_ENTRIES = 1 << 16  # key/value pairs, and tensors
MAX_DIMS = 8
ELEMENTS_PER_BYTE = 8  # the densest quantisations store under 2 bits an element
SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
STRING, ARRAY = 8, 9


class _Reader:
    def __init__(self, f: BinaryIO, size: int):
        self.f, self.size = f, size

    def room(self, n: int, what: str) -> None:
        if n > self.size - self.f.tell():
            raise BadInput(f"{what} runs past the end of the file ({n:,} bytes declared)")

    def take(self, n: int, what: str) -> bytes:
        self.room(n, what)
        return self.f.read(n)

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def skip_string(self, what: str) -> None:
        self.take_skip(self.u64(what), what)

    def take_skip(self, n: int, what: str) -> None:
        self.room(n, what)
        self.f.seek(n, 1)

    def skip_value(self, kind: int, what: str, nested: bool = False) -> None:
        if kind in SCALARS:
            self.take_skip(SCALARS[kind], what)
        elif kind == STRING:
            self.skip_string(what)
        elif kind == ARRAY and not nested:
            element, count = self.u32(what), self.u64(what)
            if count > MAX_ARRAY:
                raise BadInput(f"{what} declares {count:,} elements, more than the {MAX_ARRAY:,} a model file holds")
            if element in SCALARS:
                self.take_skip(count * SCALARS[element], what)
            else:
                for _ in range(count):
                    self.skip_value(element, what, nested=True)
        else:
            raise BadInput(f"{what} has value type {kind}, which GGUF does not define here")


def check_gguf_header(path: str | Path) -> None:
    """Refuse (one ``BadInput`` naming the file) a GGUF file whose header declares more than it
    holds or more than a model file has, reading it sequentially with no allocation beyond a few
    bytes at a time."""
    path = Path(path)
    try:
        _check_header(path)
    except BadInput as err:
        raise BadInput(f"{path}: not a readable GGUF file ({err})") from None


def _check_header(path: Path) -> None:
    with path.open("rb") as f:
        r = _Reader(f, path.stat().st_size)
        if r.take(4, "the magic number") != b"GGUF":
            raise BadInput("no GGUF magic number")
        version = r.u32("the version")
        if version not in (2, 3):
            raise BadInput(f"GGUF version {version}, expected 2 or 3")
        tensors, entries = r.u64("the tensor count"), r.u64("the key/value count")
        for count, what in ((tensors, "tensors"), (entries, "key/value pairs")):
            if count > MAX_ENTRIES:
                raise BadInput(f"declares {count:,} {what}, more than the {MAX_ENTRIES:,} a model file holds")
        for i in range(entries):
            r.skip_string(f"key {i}")
            r.skip_value(r.u32(f"key {i}'s type"), f"key {i}'s value")
        for i in range(tensors):
            r.skip_string(f"tensor {i}'s name")
            dims = r.u32(f"tensor {i}'s dimension count")
            if dims > MAX_DIMS:
                raise BadInput(f"tensor {i} declares {dims} dimensions, at most {MAX_DIMS} expected")
            elements = math.prod(r.u64(f"tensor {i}'s shape") for _ in range(dims))
            if elements > ELEMENTS_PER_BYTE * r.size:  # its data cannot be in the file
                raise BadInput(f"tensor {i} declares {elements:,} elements, more than a file of {r.size:,} bytes holds")
            r.take_skip(4 + 8, f"tensor {i}'s type and offset")
