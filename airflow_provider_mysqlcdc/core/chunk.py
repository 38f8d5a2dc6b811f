"""Snapshot chunks (half-open primary-key ranges), chunk groups, and locating the chunk of a key.

A table's splits are half-open intervals over the chunk key: ``(-inf, e1)``, ``[s, e)``, ...,
``[s, +inf)``. Their union covers every possible key exactly once; the unbounded ends catch rows
inserted beyond the old min/max while the snapshot runs. ``start``/``end`` are tuples of key
values (one per chunk-key column), ``None`` for unbounded.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from airflow_provider_mysqlcdc.core.keys import (
    INT,
    Collation,
    KeyColumn,
    KeyOrder,
    decode_key_value,
    encode_key_value,
)

# Airflow's default [core] max_map_length: a mapped task cannot expand into more instances.
DEFAULT_MAX_MAP_LENGTH = 1024
DEFAULT_CHUNK_SIZE = 8096


@dataclass(frozen=True)
class SnapshotChunk:
    table: str  # "db.table"
    split_id: int  # index of the split within its table, in key order
    key_columns: tuple[KeyColumn, ...]
    start: tuple[Any, ...] | None  # inclusive; None = unbounded below
    end: tuple[Any, ...] | None  # exclusive; None = unbounded above

    @property
    def id(self) -> str:
        return f"{self.table}#{self.split_id}"

    @property
    def key_names(self) -> list[str]:
        return [c.name for c in self.key_columns]

    def contains(self, key: Sequence[Any], order: KeyOrder) -> bool:
        """Whether ``key`` lies in this split, ordered as the database orders it."""
        k = order.sort_key(key)
        if self.start is not None and k < order.sort_key(self.start):
            return False
        return not (self.end is not None and not k < order.sort_key(self.end))

    def to_dict(self) -> dict[str, Any]:
        kinds = [c.kind for c in self.key_columns]
        return {
            "table": self.table,
            "split_id": self.split_id,
            "key_columns": self.key_names,
            "key_types": kinds,
            "key_collations": [c.collation for c in self.key_columns],
            "start": None
            if self.start is None
            else [encode_key_value(k, v) for k, v in zip(kinds, self.start, strict=True)],
            "end": None if self.end is None else [encode_key_value(k, v) for k, v in zip(kinds, self.end, strict=True)],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SnapshotChunk:
        names = d["key_columns"]
        kinds = d.get("key_types") or ["int"] * len(names)
        colls = d.get("key_collations") or [None] * len(names)
        cols = tuple(KeyColumn(n, k, c) for n, k, c in zip(names, kinds, colls, strict=True))

        def dec(vals: list[Any] | None) -> tuple[Any, ...] | None:
            if vals is None:
                return None
            return tuple(decode_key_value(k, v) for k, v in zip(kinds, vals, strict=True))

        return cls(d["table"], int(d["split_id"]), cols, dec(d.get("start")), dec(d.get("end")))


def fill_gaps(splits: Sequence[SnapshotChunk]) -> list[SnapshotChunk]:
    """Some splits of one table (a repair re-reads a few chunks) completed to tile its key space.

    Each gap becomes one filler split whose id is that of a chunk in the gap (ids follow key
    order, so the result still sorts by id): a key there is located in a split that is not among
    ``splits``, exactly as it would be in the other chunks of the table. Splits that already tile
    come back as they are."""
    ordered = sorted(splits, key=lambda s: s.split_id)
    if not ordered:
        return []
    out: list[SnapshotChunk] = []
    first = ordered[0]
    if first.start is not None:
        out.append(SnapshotChunk(first.table, first.split_id - 1, first.key_columns, None, first.start))
    for a, b in itertools.pairwise(ordered):
        out.append(a)
        if a.end != b.start:
            out.append(SnapshotChunk(a.table, a.split_id + 1, a.key_columns, a.end, b.start))
    last = ordered[-1]
    out.append(last)
    if last.end is not None:
        out.append(SnapshotChunk(last.table, last.split_id + 1, last.key_columns, last.end, None))
    return out


def check_table_splits(splits: Sequence[SnapshotChunk], order: KeyOrder) -> None:
    """Raise unless the splits of one table tile the key space: unbounded ends, adjacent, increasing."""
    if not splits:
        raise ValueError("a table needs at least one split")
    if splits[0].start is not None or splits[-1].end is not None:
        raise ValueError(f"{splits[0].table}: first split must start at -inf and last end at +inf")
    for a, b in itertools.pairwise(splits):
        if a.end is None or b.start is None or order.sort_key(a.end) != order.sort_key(b.start):
            raise ValueError(f"{a.table}: splits {a.split_id} and {b.split_id} are not adjacent")
        if b.end is not None and not order.sort_key(b.start) < order.sort_key(b.end):
            raise ValueError(f"{b.table}: split {b.split_id} is empty or reversed")


class ChunkLocator:
    """Finds the split of one table that holds a key: binary search over sorted boundaries."""

    def __init__(self, splits: Sequence[SnapshotChunk], collations: dict[str, Collation] | None = None):
        self.splits = sorted(splits, key=lambda s: s.split_id)
        if not self.splits:
            raise ValueError("no splits to locate keys in")
        self.order = KeyOrder(self.splits[0].key_columns, collations)
        self.order.prefetch([s.start for s in self.splits[1:] if s.start is not None])
        check_table_splits(self.splits, self.order)
        # Boundary i is the start of split i+1 (== end of split i).
        self._bounds = [self.order.sort_key(s.start) for s in self.splits[1:]]  # type: ignore[arg-type]

    def index_of(self, key: Sequence[Any]) -> int:
        """Position (in ``self.splits``) of the split containing ``key``."""
        return bisect.bisect_right(self._bounds, self.order.sort_key(key))

    def locate(self, key: Sequence[Any]) -> SnapshotChunk:
        return self.splits[self.index_of(key)]

    def indexes_of(self, keys: Sequence[Sequence[Any]]) -> Sequence[int]:
        """Positions of many keys at once: one vectorised search for the common single integer key
        (a whole data file's keys), else one binary search each."""
        cols = self.splits[0].key_columns
        if len(cols) == 1 and cols[0].kind == INT and keys:
            try:
                bounds = np.array([int(s.start[0]) for s in self.splits[1:]], dtype=np.int64)  # type: ignore[index]
                values = np.fromiter((k[0] for k in keys), dtype=np.int64, count=len(keys))
            except (OverflowError, TypeError):  # BIGINT UNSIGNED beyond 2**63, or not integers
                return [self.index_of(k) for k in keys]
            return np.searchsorted(bounds, values, side="right")  # type: ignore[no-any-return]
        self.order.prefetch(keys)
        return [self.index_of(k) for k in keys]


@dataclass
class ChunkGroup:
    """The chunks one mapped snapshot task (one Spark application) reads together."""

    group_id: int
    splits: list[SnapshotChunk] = field(default_factory=list)

    @property
    def tables(self) -> list[str]:
        return list(dict.fromkeys(s.table for s in self.splits))

    def label(self) -> str:
        """Short, for Airflow's map_index_template: 'group 3: 12 tables, 40 chunks'. A label listing every
        table broke the UI's breadcrumb; the list is :meth:`chunk_ranges` (the task's rendered fields)."""
        tables, chunks = len(self.tables), len(self.splits)
        return (f"group {self.group_id}: {tables} table{'s' if tables != 1 else ''}, "
                f"{chunks} chunk{'s' if chunks != 1 else ''}")  # fmt: skip

    def chunk_ranges(self) -> str:
        """Each table with its chunks: 'shop.orders chunks 0–63, shop.items chunk 0'."""
        parts = []
        for t in self.tables:
            ids = [s.split_id for s in self.splits if s.table == t]
            parts.append(f"{t} chunk {ids[0]}" if len(ids) == 1 else f"{t} chunks {ids[0]}–{ids[-1]}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "splits": [s.to_dict() for s in self.splits]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChunkGroup:
        return cls(int(d["group_id"]), [SnapshotChunk.from_dict(s) for s in d["splits"]])


def group_splits(
    splits: Iterable[SnapshotChunk],
    chunks_per_group: int,
    max_groups: int = DEFAULT_MAX_MAP_LENGTH,
) -> list[ChunkGroup]:
    """Pack splits, in order, into groups of ``chunks_per_group``.

    If that would make more groups than Airflow can map (``max_map_length``), groups grow so that
    exactly ``max_groups`` or fewer are made: a plan never fails on a big database.
    """
    if chunks_per_group < 1:
        raise ValueError(f"chunks_per_group must be >= 1, got {chunks_per_group}")
    if max_groups < 1:
        raise ValueError(f"max_groups must be >= 1, got {max_groups}")
    items = list(splits)
    if not items:
        return []
    per = max(chunks_per_group, math.ceil(len(items) / max_groups))
    return [ChunkGroup(i, items[j : j + per]) for i, j in enumerate(range(0, len(items), per))]
