"""Binlog offsets: where a reader is in the server's binary log.

An offset is ``(file, pos)``, optionally with the GTID set executed at that point and the identity
of the server whose binlog it names (``server``: MySQL's ``server_uuid``, MariaDB's ``server_id``).
A file:pos means nothing on another server: after a failover the offset is translated by its GTID
set (``mysql/gtid_positions.py``, docs/architecture.md "Offsets and failover"). Offsets are
ordered by the *numeric suffix* of the file name and then the position, so a rotation from
``mysql-bin.000009`` to ``mysql-bin.000010`` compares correctly (a string compare would not when
the suffix widens, and ``end_log_pos`` alone ignores the file entirely).

Only transaction boundaries are valid resume points: a reader that resumes between a TABLE_MAP
event and its rows event cannot decode the rows. Offsets produced by this package always come
from ``SHOW MASTER STATUS`` / ``Binlog_snapshot_*`` or from the end of an XID/COMMIT event.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import total_ordering
from typing import Any

_SUFFIX = re.compile(r"\.(\d+)$")


def binlog_file_number(file: str) -> int:
    """The numeric suffix of a binlog file name (``mysql-bin.000042`` → 42)."""
    m = _SUFFIX.search(file)
    if not m:
        raise ValueError(f"not a binlog file name (expected <base>.<number>): {file!r}")
    return int(m.group(1))


@total_ordering
@dataclass(frozen=True)
class BinlogOffset:
    file: str
    pos: int
    gtid_set: str | None = field(default=None, compare=False)
    server: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        binlog_file_number(self.file)  # validates the name
        if self.pos < 0:
            raise ValueError(f"binlog position must be >= 0, got {self.pos}")

    @property
    def file_number(self) -> int:
        return binlog_file_number(self.file)

    def sort_key(self) -> tuple[int, int]:
        return (self.file_number, self.pos)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, BinlogOffset):
            return NotImplemented
        return self.sort_key() < other.sort_key()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BinlogOffset):
            return NotImplemented
        return self.sort_key() == other.sort_key()

    def __hash__(self) -> int:
        return hash(self.sort_key())

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"file": self.file, "pos": self.pos}
        if self.gtid_set:
            d["gtid_set"] = self.gtid_set
        if self.server:
            d["server"] = self.server
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BinlogOffset:
        try:
            return cls(str(d["file"]), int(d["pos"]), d.get("gtid_set") or None, d.get("server") or None)
        except KeyError as exc:
            raise ValueError(f"binlog offset needs 'file' and 'pos', got {d!r}") from exc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> BinlogOffset:
        return cls.from_dict(json.loads(s))

    def position(self) -> BinlogOffset:
        """Only file:pos, for where a GTID set or server identity would mislead (a change's offset)."""
        return BinlogOffset(self.file, self.pos)

    def on(self, server: str | None, gtid_set: str | None) -> BinlogOffset:
        """This position with the server identity and GTID set it was read with."""
        return BinlogOffset(self.file, self.pos, gtid_set or None, server or None)

    @classmethod
    def parse(cls, text: str) -> BinlogOffset:
        """Parse ``file:pos`` (what ``str()`` prints and what users type for specific-offset)."""
        file, sep, pos = text.rpartition(":")
        if not sep or not pos.isdigit():
            raise ValueError(f"expected <binlog file>:<position>, e.g. mysql-bin.000003:4, got {text!r}")
        return cls(file, int(pos))


def min_offset(offsets: list[BinlogOffset]) -> BinlogOffset:
    if not offsets:
        raise ValueError("no offsets to take the minimum of")
    return min(offsets)


def binlog_segments(
    files: list[tuple[str, int]], start: BinlogOffset, end: BinlogOffset
) -> list[tuple[str, int, int]]:
    """``(file, from, to)`` pieces of ``[start, end)``, one per binlog file, in order."""
    out = []
    for f, size in sorted(files, key=lambda x: binlog_file_number(x[0])):
        n = binlog_file_number(f)
        if n < start.file_number or n > end.file_number:
            continue
        lo = start.pos if n == start.file_number else 4
        hi = end.pos if n == end.file_number else size
        if hi > lo:
            out.append((f, lo, hi))
    return out


def binlog_bytes(files: list[tuple[str, int]], start: BinlogOffset, end: BinlogOffset) -> int:
    """Bytes of binlog in ``[start, end)`` given ``SHOW BINARY LOGS`` (name, size) rows."""
    return sum(hi - lo for _, lo, hi in binlog_segments(files, start, end))
