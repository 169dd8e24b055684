"""A GGUF file's metadata without its payloads: scalar key/values, the length of each array, the tensor names.

The gguf package's reader builds every field, the 49,152 vocabulary strings of the default model included, which
takes about 4 s; `appliance doctor` only needs a dozen numbers, and reading them this way takes milliseconds."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
# GGUF value types: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md ("gguf_metadata_value_type").
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class GGUFHeaderError(ValueError):
    """Not a GGUF file, or one cut short."""


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    values: dict[str, int | float | bool | str]  # scalar and string metadata
    array_lengths: dict[str, int]  # array metadata: only how many elements
    tensor_names: frozenset[str]
    tensors: dict[str, tuple[int, tuple[int, ...]]]  # name -> (ggml type, dimensions, innermost first)


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.at = 0

    def unpack(self, fmt: str) -> int | float | bool:
        try:
            (value,) = struct.unpack_from(fmt, self.data, self.at)
        except struct.error:
            raise GGUFHeaderError("the file ends inside its metadata") from None
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = int(self.unpack("<Q"))
        if self.at + length > len(self.data):
            raise GGUFHeaderError("the file ends inside its metadata")
        text = bytes(self.data[self.at : self.at + length]).decode("utf-8", errors="replace")
        self.at += length
        return text

    def skip(self, kind: int, count: int) -> None:
        """Step over `count` values of one type without building them."""
        if kind in _SCALARS:
            self.at += struct.calcsize(_SCALARS[kind]) * count
        elif kind == STRING:
            for _ in range(count):
                length = int(self.unpack("<Q"))  # each string: its length, then its bytes
                self.at += length
        elif kind == ARRAY:
            for _ in range(count):
                inner, length = int(self.unpack("<I")), int(self.unpack("<Q"))
                self.skip(inner, length)
        else:
            raise GGUFHeaderError(f"unknown GGUF value type {kind}")


def read_header(path: Path) -> GGUFHeader:
    """Raises GGUFHeaderError (not a GGUF, or cut short) or OSError (unreadable)."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != MAGIC:
            raise GGUFHeaderError(f"{path.name} is not a GGUF file")
        cursor = _Cursor(data)
        cursor.at = 4
        version = cursor.unpack("<I")
        if version < 2:
            raise GGUFHeaderError(f"{path.name} is GGUF version {version}; only 2 and later are read")
        tensor_count, kv_count = int(cursor.unpack("<Q")), int(cursor.unpack("<Q"))
        values: dict[str, int | float | bool | str] = {}
        lengths: dict[str, int] = {}
        for _ in range(kv_count):
            key, kind = cursor.string(), int(cursor.unpack("<I"))
            if kind == ARRAY:
                inner, length = int(cursor.unpack("<I")), int(cursor.unpack("<Q"))
                cursor.skip(inner, length)
                lengths[key] = length
            elif kind == STRING:
                values[key] = cursor.string()
            elif kind in _SCALARS:
                values[key] = cursor.unpack(_SCALARS[kind])
            else:
                raise GGUFHeaderError(f"{path.name}: unknown GGUF value type {kind} for {key}")
        tensors = {}
        for _ in range(tensor_count):
            name = cursor.string()
            dims = tuple(int(cursor.unpack("<Q")) for _ in range(int(cursor.unpack("<I"))))
            tensors[name] = (int(cursor.unpack("<I")), dims)
            cursor.at += 8  # the data offset
        return GGUFHeader(values, lengths, frozenset(tensors), tensors)
