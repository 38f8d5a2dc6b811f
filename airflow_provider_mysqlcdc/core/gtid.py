"""GTID sets: which transactions a point in a binlog has behind it, comparable across servers.

A file:pos names a point in *one* server's binlog; after a failover the new primary has the same
transactions at other positions. A GTID set names the same point on every server of a replication
topology, so offsets carry one (``core/offset.py``) and a failover translates the set back into a
position on the new server (``mysql/gtid_positions.py``).

The two flavours differ in what a set is:

- **MySQL** (``uuid:1-5:7,uuid2:tag:1-3``): a true set of transactions, per source uuid and tag
  (tags since 8.3: ``uuid:tag:n``), as intervals.
- **MariaDB** (``0-1-100,1-2-7``): a *position* per replication domain, the last transaction
  applied (``domain-server-seq``); within a domain the sequence numbers only grow (strict mode),
  so it contains transaction ``d-s-n`` iff its ``d`` entry has a sequence >= ``n``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_INTERVAL = re.compile(r"^(\d+)(?:-(\d+))?$")
_TAG = re.compile(r"^[a-z_][a-z0-9_]{0,31}$", re.IGNORECASE)
_MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


class GtidSetError(ValueError):
    """A GTID or GTID set text this module cannot read."""


@dataclass(frozen=True)
class Gtid:
    """One transaction: MySQL ``(uuid, tag, n)`` or MariaDB ``(domain, server, seq)`` as
    ``source=str(domain)``, ``tag=str(server)``."""

    source: str
    tag: str
    number: int
    mariadb: bool

    @classmethod
    def parse(cls, text: str) -> Gtid:
        t = text.strip().strip("'\"")
        m = _MARIADB_GTID.match(t)
        if m:
            return cls(m.group(1), m.group(2), int(m.group(3)), True)
        parts = t.split(":")
        if len(parts) in (2, 3) and _UUID.match(parts[0]) and parts[-1].isdigit():
            tag = parts[1].lower() if len(parts) == 3 else ""
            return cls(parts[0].lower(), tag, int(parts[-1]), False)
        raise GtidSetError(f"not a GTID: {text!r}")

    def __str__(self) -> str:
        if self.mariadb:
            return f"{self.source}-{self.tag}-{self.number}"
        return f"{self.source}:{self.tag}:{self.number}" if self.tag else f"{self.source}:{self.number}"


class GtidSet:
    """An immutable GTID set of either flavour; see the module doc for what each means."""

    def __init__(self, mariadb: bool, entries: dict[tuple[str, str], tuple[tuple[int, int], ...]]):
        # MySQL: (uuid, tag) -> sorted disjoint intervals [lo, hi]
        # MariaDB: (domain, "") -> ((server, seq),)  — the domain's last transaction
        self.mariadb = mariadb
        self._entries = entries

    # ---------------------------------------------------------------- reading
    @classmethod
    def parse(cls, text: str | None, mariadb: bool | None = None) -> GtidSet:
        """Read ``@@gtid_executed`` / ``@@gtid_binlog_pos`` text (``mariadb`` None: guess from it)."""
        body = (text or "").strip().strip("[]").replace("\n", "")
        items = [p.strip() for p in body.split(",") if p.strip()]
        if mariadb is None:
            mariadb = bool(items) and all(_MARIADB_GTID.match(p) for p in items)
        if mariadb:
            return cls(True, cls._mariadb_entries(items))
        return cls(False, cls._mysql_entries(items))

    @staticmethod
    def _mariadb_entries(items: list[str]) -> dict[tuple[str, str], tuple[tuple[int, int], ...]]:
        out: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {}
        for p in items:
            m = _MARIADB_GTID.match(p)
            if not m:
                raise GtidSetError(f"not a MariaDB GTID position (domain-server-seq): {p!r}")
            key = (m.group(1), "")
            if key not in out or out[key][0][1] < int(m.group(3)):
                out[key] = ((int(m.group(2)), int(m.group(3))),)
        return out

    @staticmethod
    def _mysql_entries(items: list[str]) -> dict[tuple[str, str], tuple[tuple[int, int], ...]]:
        raw: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for p in items:
            parts = p.split(":")
            if not _UUID.match(parts[0]):
                raise GtidSetError(f"not a MySQL GTID set (uuid:interval[:interval]...): {p!r}")
            uuid, tag = parts[0].lower(), ""
            for part in parts[1:]:
                m = _INTERVAL.match(part.strip())
                if m:
                    lo = int(m.group(1))
                    raw.setdefault((uuid, tag), []).append((lo, int(m.group(2) or lo)))
                elif _TAG.match(part.strip()):
                    tag = part.strip().lower()
                else:
                    raise GtidSetError(f"not a MySQL GTID set (uuid[:tag]:interval[:interval]...): {p!r}")
        return {k: _merged(v) for k, v in raw.items()}

    # ---------------------------------------------------------------- questions
    def contains(self, gtid: Gtid) -> bool:
        """Whether the transaction ``gtid`` is behind this point."""
        if gtid.mariadb != self.mariadb:
            raise GtidSetError(f"GTID {gtid} and set {self} are of different server flavours")
        if self.mariadb:
            entry = self._entries.get((gtid.source, ""))
            return entry is not None and entry[0][1] >= gtid.number
        return any(lo <= gtid.number <= hi for lo, hi in self._entries.get((gtid.source, gtid.tag), ()))

    def issuperset(self, other: GtidSet) -> bool:
        """Whether every transaction behind ``other`` is behind this point too."""
        if other.mariadb != self.mariadb:
            return not other._entries
        if self.mariadb:
            return all(k in self._entries and self._entries[k][0][1] >= v[0][1] for k, v in other._entries.items())
        for key, intervals in other._entries.items():
            mine = self._entries.get(key, ())
            if not all(any(a <= lo and hi <= b for a, b in mine) for lo, hi in intervals):
                return False
        return True

    def added(self, gtid: Gtid) -> GtidSet:
        """This set with one more transaction behind it."""
        entries = dict(self._entries)
        if self.mariadb:
            key = (gtid.source, "")
            if key not in entries or entries[key][0][1] < gtid.number:
                entries[key] = ((int(gtid.tag), gtid.number),)
        else:
            key = (gtid.source, gtid.tag)
            entries[key] = _merged([*entries.get(key, ()), (gtid.number, gtid.number)])
        return GtidSet(self.mariadb, entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GtidSet) and (self.mariadb, self._entries) == (other.mariadb, other._entries)

    def __hash__(self) -> int:
        return hash((self.mariadb, tuple(sorted(self._entries.items()))))

    def __str__(self) -> str:
        if self.mariadb:
            ordered = sorted(self._entries.items(), key=lambda kv: int(kv[0][0]))
            return ",".join(f"{d}-{v[0][0]}-{v[0][1]}" for (d, _), v in ordered)
        by_uuid: dict[str, list[str]] = {}
        for (uuid, tag), intervals in sorted(self._entries.items()):
            text = ":".join(f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in intervals)
            by_uuid.setdefault(uuid, []).append(f"{tag}:{text}" if tag else text)
        return ",".join(f"{uuid}:{':'.join(parts)}" for uuid, parts in by_uuid.items())

    def __repr__(self) -> str:
        return f"GtidSet({str(self)!r})"


def _merged(intervals: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)
