"""The audit file's chain: each line is canonical JSON (sorted keys, no spaces, UTF-8) carrying its `seq`, the hash
of the line before it (`prev`) and its own `hash`, SHA-256 over the line's canonical JSON without `hash`; so a line
edited, removed, inserted or moved breaks the chain at that line, and `verify` names it.

A chain cannot show that lines were cut from its end: keep the last hash `verify` prints somewhere else (a ticket, a
log, a second machine) and compare it with the next run's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "appliance-audit/1"
GENESIS = "0" * 64  # the `prev` of the header, which follows nothing
HEADER, EXPORT, REQUEST = "header", "export", "request"  # the kinds of line


class ChainBroken(Exception):
    """The file is not an intact audit chain; `line` is the first bad one (from 1), 0 where the file itself is."""

    def __init__(self, path: Path, line: int, why: str) -> None:
        where = f"{path}: line {line}" if line else str(path)
        super().__init__(f"{where}: {why}")
        self.line = line


_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_string = json.encoder.encode_basestring  # what _encode makes of a str, without its per-call set-up


def _joined(members: dict[str, str]) -> bytes:
    """The canonical JSON of an object from its members' canonical values, each encoded once: a line is hashed
    without its `hash` and written with it, and its record is the most of it."""
    return ("{" + ",".join(f"{_string(key)}:{value}" for key, value in sorted(members.items())) + "}").encode()


def sealed(kind: str, seq: int, prev: str, body: dict[str, Any]) -> tuple[bytes, str]:
    """One line of the file, newline included, and its hash: a line of `kind` carrying `body` under its kind's
    name."""
    members = {"seq": str(seq), "kind": _string(kind), kind: _encode(body), "prev": _string(prev)}
    digest = hashlib.sha256(_joined(members)).hexdigest()
    members["hash"] = _string(digest)
    return _joined(members) + b"\n", digest


@dataclass(frozen=True, slots=True)
class ChainEnd:
    """Where an intact file ends: what an export appends after."""

    lines: int
    seq: int  # the last line's
    hash: str  # the last line's, which the next line's `prev` names
    since: str | None  # the header's lower bound on arrival, if it had one
    last_request: dict[str, Any] | None  # the last exported history row, or None before the first


def verify(path: Path) -> ChainEnd:
    """Read the whole file, a line at a time; raises ChainBroken naming the first line that does not hold."""
    end: ChainEnd | None = None
    for number, line, digest in _numbered(path):
        end = _check(path, number, line, digest, end)
    if end is None:
        raise ChainBroken(path, 0, "the file is empty: an audit export starts with its header line")
    return end


def _numbered(path: Path) -> Iterator[tuple[int, dict[str, Any], str]]:
    """Each line parsed, with the hash of its content without `hash`."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            if not raw.endswith(b"\n"):
                raise ChainBroken(path, number, "the last line is cut short (no newline): the file was truncated")
            try:
                line = json.loads(raw)
            except ValueError:
                raise ChainBroken(path, number, "not a JSON line: edited or truncated") from None
            members = {key: _encode(value) for key, value in line.items()} if isinstance(line, dict) else {}
            if _joined(members) + b"\n" != raw:
                raise ChainBroken(path, number, "not in canonical form (sorted keys, no spaces): edited")
            members.pop("hash", None)
            yield number, line, hashlib.sha256(_joined(members)).hexdigest()


def _check(path: Path, number: int, line: dict[str, Any], digest: str, before: ChainEnd | None) -> ChainEnd:
    claimed = line.get("hash")
    if claimed != digest:
        raise ChainBroken(path, number, "its hash does not match its content: the line was edited")
    expected_prev = GENESIS if before is None else before.hash
    if line.get("prev") != expected_prev:
        raise ChainBroken(path, number, "its prev is not the hash of the line before: a line was removed, "
                          "inserted or moved here")  # fmt: skip
    seq = 0 if before is None else before.seq + 1
    if line.get("seq") != seq:
        raise ChainBroken(path, number, f"its seq is {line.get('seq')!r}, expected {seq}")
    kind = line.get("kind")
    if before is None:
        header = line.get(HEADER)
        if kind != HEADER or not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ChainBroken(path, number, f"the first line is not a {FORMAT} header")
        return ChainEnd(number, seq, claimed, header.get("since"), None)
    if kind not in (EXPORT, REQUEST) or not isinstance(line.get(kind), dict):
        raise ChainBroken(path, number, f"unknown kind of line {kind!r}")
    last = line[REQUEST] if kind == REQUEST else before.last_request
    return ChainEnd(number, seq, claimed, before.since, last)
