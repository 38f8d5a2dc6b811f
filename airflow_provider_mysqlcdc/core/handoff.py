"""The stream handoff filter (DESIGN §3 "Stream handoff").

The stream starts at the minimum high watermark of all chunks. A change at binlog offset ``p``
(the start of its transaction) to key ``k`` of table ``T`` is emitted iff ``p >= HW(chunk of T
containing k)``; once ``p >= max HW(T)`` every change to ``T`` passes without a lookup. Tables not in
the manifest are not captured.

An update is filtered *per image*: its delete-half (the before key) by the chunk of the before key
and its upsert-half (the after key) by the chunk of the after key. They differ only when the update
moves a key between chunks with different HWs; emitting the upsert into a chunk whose snapshot is
newer than ``p`` would overwrite that newer row with an older image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_mysqlcdc.core.chunk import ChunkLocator, SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.offset import BinlogOffset


@dataclass(frozen=True)
class TableFilter:
    table: str
    locator: ChunkLocator
    high_watermarks: tuple[BinlogOffset, ...]  # aligned with locator.splits
    max_high_watermark: BinlogOffset

    def emits(self, key: Sequence[Any], offset: BinlogOffset) -> bool:
        if offset >= self.max_high_watermark:
            return True
        return offset >= self.high_watermarks[self.locator.index_of(key)]


class HandoffFilter:
    """Built from the manifest: per table its sorted chunk boundaries and each chunk's HW."""

    def __init__(
        self,
        tables: dict[str, list[tuple[SnapshotChunk, BinlogOffset]]],
        collations: dict[str, Collation] | None = None,
    ):
        self._tables: dict[str, TableFilter] = {}
        for table, pairs in tables.items():
            if not pairs:
                raise ValueError(f"table {table} has no chunks in the manifest")
            ordered = sorted(pairs, key=lambda p: p[0].split_id)
            locator = ChunkLocator([s for s, _ in ordered], collations)
            hws = tuple(hw for _, hw in ordered)
            self._tables[table] = TableFilter(table, locator, hws, max(hws))

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

    def emits(self, table: str, key: Sequence[Any], offset: BinlogOffset) -> bool:
        """Whether a change to ``key`` of ``table`` at ``offset`` must reach the sink."""
        t = self._tables.get(table)
        return t is not None and t.emits(key, offset)
