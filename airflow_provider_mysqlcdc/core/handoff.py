"""The handoff rule: which binlog changes the stream applies on top of the chunk snapshots.

See ``docs/architecture.md``, sections "The handoff" and "Invariants". Each chunk of a table was
snapshotted as of its own high watermark (HW). The stream starts at the minimum HW of all chunks,
so it re-reads changes some chunks already contain. A change at binlog offset ``p`` (the start of
its transaction) to key ``k`` of table ``T`` is applied iff ``p >= HW(chunk of T containing k)``:
older changes are in that chunk's snapshot, and applying them again would overwrite a newer row
with an older image. Once ``p >= max HW(T)`` every change to ``T`` passes without a lookup. Tables
not in the manifest are not captured.

An update is judged *per image*: its delete-half by the chunk of the before key, its upsert-half
by the chunk of the after key. They differ only when an update moves a key between chunks with
different HWs; then only the passing half is emitted (the same question Flink CDC's ``shouldEmit``
asks per split, asked here per image).

:func:`admit` is that rule as one pure function; the stream's read loop calls it for every decoded
change. It allocates nothing unless it has to reduce an update to one half, which is rare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core.change import CREATE, DELETE, UPDATE, RowChange
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator, SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.offset import BinlogOffset

#: A binlog offset as ``BinlogOffset.sort_key()``: compared as a plain tuple in the hot loop,
#: because comparing ``BinlogOffset`` objects parses their file names every time.
OffsetKey = tuple[int, int]


@dataclass(frozen=True)
class TableFilter:
    """One captured table: its chunks (in key order) and each chunk's HW."""

    table: str
    locator: ChunkLocator
    high_watermarks: tuple[BinlogOffset, ...]  # aligned with locator.splits
    max_high_watermark: BinlogOffset
    ended_at: BinlogOffset | None = None  # a DROP/RENAME ended capture: later changes are not the table's
    hw_keys: tuple[OffsetKey, ...] = field(init=False, repr=False, compare=False)
    min_hw_key: OffsetKey = field(init=False, repr=False, compare=False)
    max_hw_key: OffsetKey = field(init=False, repr=False, compare=False)
    end_key: OffsetKey | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keys = tuple(hw.sort_key() for hw in self.high_watermarks)
        object.__setattr__(self, "hw_keys", keys)
        object.__setattr__(self, "min_hw_key", min(keys))
        object.__setattr__(self, "max_hw_key", self.max_high_watermark.sort_key())
        object.__setattr__(self, "end_key", None if self.ended_at is None else self.ended_at.sort_key())

    def admits_every_row(self, p: OffsetKey) -> bool:
        """Whether every row change of a transaction starting at ``p`` passes whole (:func:`admit`'s
        common case once the stream has caught up): newer than every chunk's snapshot and not after
        the end of capture. Decided once per rows event instead of once per row."""
        return p >= self.max_hw_key and (self.end_key is None or p <= self.end_key)

    def emits(self, key: Sequence[Any], offset: BinlogOffset) -> bool:
        """Whether a change to ``key`` at ``offset`` is newer than the snapshot of ``key``'s chunk."""
        p = offset.sort_key()
        if self.end_key is not None and p > self.end_key:
            return False
        return p >= self.max_hw_key or p >= self.hw_keys[self.locator.index_of(key)]


class HandoffFilter:
    """Built from the manifest: per table its sorted chunk boundaries and each chunk's HW."""

    def __init__(
        self,
        tables: dict[str, list[tuple[SnapshotChunk, BinlogOffset]]],
        collations: dict[str, Collation] | None = None,
        ended_at: dict[str, BinlogOffset] | None = None,
    ):
        self._tables: dict[str, TableFilter] = {}
        for table, pairs in tables.items():
            if not pairs:
                raise ValueError(f"table {table} has no chunks in the manifest")
            ordered = sorted(pairs, key=lambda p: p[0].split_id)
            locator = ChunkLocator([s for s, _ in ordered], collations)
            hws = tuple(hw for _, hw in ordered)
            self._tables[table] = TableFilter(table, locator, hws, max(hws), (ended_at or {}).get(table))

    @property
    def tables(self) -> list[str]:
        return sorted(self._tables)

    def start_offset(self) -> BinlogOffset:
        """Where the stream must start: the minimum HW over every chunk of every table."""
        return min(min(t.high_watermarks) for t in self._tables.values())

    def max_high_watermark(self, table: str) -> BinlogOffset:
        return self._tables[table].max_high_watermark

    def captures(self, table: str) -> bool:
        return table in self._tables

    def table(self, table: str) -> TableFilter | None:
        """The filter of one captured table; None when ``table`` is not captured."""
        return self._tables.get(table)

    def emits(self, table: str, key: Sequence[Any], offset: BinlogOffset) -> bool:
        """Whether a change to ``key`` of ``table`` at ``offset`` must reach the sink."""
        t = self._tables.get(table)
        return t is not None and t.emits(key, offset)


def admit(
    change: RowChange,
    handoff: HandoffFilter,
    key_columns: Sequence[str],
    tx_key: OffsetKey | None = None,
) -> RowChange | None:
    """The part of ``change`` the stream must apply: ``change`` itself, one half of it, or None.

    ``key_columns`` are the table's chunk key columns (the names the row images carry);
    ``tx_key`` is ``change.tx_offset.sort_key()``, passed in by a caller that computes it once per
    transaction instead of once per change.

    * a table that is not captured, or a change after the DROP/RENAME that ended its capture: None;
    * a DDL statement (``op='s'``): an ALTER always passes (the stream must follow the schema); a
      TRUNCATE/DROP/RENAME/... older than every chunk of the table is already in its snapshot;
    * an insert or delete: passes iff it is newer than the snapshot of its key's chunk;
    * an update: each image by its own chunk. Both pass: the update. Only the delete-half passes
      (the after key's chunk is newer): a delete of the before image (``op='d'``, ``after=None``).
      Only the upsert-half passes: the update without its before image (``before=None``), so the
      sink upserts the after image and deletes nothing. Neither: None.
    """
    t = handoff.table(change.table)
    if t is None:
        return None
    p = change.tx_offset.sort_key() if tx_key is None else tx_key
    if t.end_key is not None and p > t.end_key:  # after the DROP/RENAME that ended its capture
        return None
    op = change.op
    if op == "s":
        if p >= t.min_hw_key or change.after["kind"] == "alter":  # type: ignore[index]
            return change
        return None
    if p >= t.max_hw_key:  # newer than every chunk: the common case once the stream caught up
        return change
    hw_keys, index_of = t.hw_keys, t.locator.index_of
    if op == CREATE:
        after = change.after
        return change if p >= hw_keys[index_of([after[c] for c in key_columns])] else None  # type: ignore[index]
    before = change.before
    if op == DELETE:
        return change if p >= hw_keys[index_of([before[c] for c in key_columns])] else None  # type: ignore[index]
    if op != UPDATE:
        raise ValueError(f"unknown row change op {op!r} (expected 'c', 'u', 'd' or 's')")
    after = change.after
    del_ok = p >= hw_keys[index_of([before[c] for c in key_columns])]  # type: ignore[index]
    ups_ok = p >= hw_keys[index_of([after[c] for c in key_columns])]  # type: ignore[index]
    return change.halves(del_ok, ups_ok)
