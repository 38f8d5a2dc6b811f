"""Which part of a binlog change belongs to a chunk's own read window.

See docs/architecture.md, "The watermark bracket" (per-chunk windows). A chunk read by the native
reader takes its own low watermark (a consistent snapshot just before its SELECT) and its own high
watermark (right after its rows are in memory). The rows it read are exact as of its HW once the
changes of ``[LW(chunk), HW(chunk))`` to its keys are replayed onto them: older changes are already
in the read, newer ones the stream emits (the handoff's ``p >= HW(chunk)``). The group's binlog
window ``[LW(group), HW(group))`` is read once; :meth:`ChunkWindows.part` keeps of each change what
some chunk's own window needs — Flink CDC's per-split backfill, asked per image as the handoff
does: an update's delete-half by the chunk of its before key, its upsert-half by the chunk of its
after key.

Why it matters: a group's window spans the whole group's read (seconds at scale), so a writer
spread over the table touches every staged chunk file and each must be read and written again; a
chunk's own window spans its read only, so most files need no rewrite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from airflow_provider_mysqlcdc.core.change import CREATE, DELETE, UPDATE, RowChange
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.offset import BinlogOffset

OffsetKey = tuple[int, int]  # BinlogOffset.sort_key()


class ChunkWindows:
    """A table's chunks of one group, each with the ``[LW, HW)`` its staged rows must be replayed over.

    ``windows`` maps split id -> (LW, HW) for the group's chunks; chunks of other groups are not in
    it and none of their changes is kept (their own group replays them).
    """

    def __init__(self, locator: ChunkLocator, windows: Mapping[int, tuple[BinlogOffset, BinlogOffset]]):
        if not windows:
            raise ValueError("a group holds at least one chunk of the table")
        self.locator = locator
        keyed = {sid: (lw.sort_key(), hw.sort_key()) for sid, (lw, hw) in windows.items()}
        self._by_index: list[tuple[OffsetKey, OffsetKey] | None] = [keyed.get(s.split_id) for s in locator.splits]
        self.min_low: OffsetKey = min(lw for lw, _ in keyed.values())
        self.max_high: OffsetKey = max(hw for _, hw in keyed.values())

    def _inside(self, key: Sequence[object], p: OffsetKey) -> bool:
        window = self._by_index[self.locator.index_of(key)]
        return window is not None and window[0] <= p < window[1]

    def part(self, change: RowChange, key_columns: Sequence[str], tx_key: OffsetKey | None = None) -> RowChange | None:
        """The part of ``change`` some chunk's window replays: the change, one half of it, or None.

        ``key_columns`` are the chunk key columns (the names the row images carry). DDL records
        (``op='s'``) pass unchanged: the replay does not apply them.
        """
        if change.op == "s":
            return change
        p = change.tx_offset.sort_key() if tx_key is None else tx_key
        if not self.min_low <= p < self.max_high:
            return None
        op, before, after = change.op, change.before, change.after
        if op == CREATE:
            return change if self._inside([after[c] for c in key_columns], p) else None  # type: ignore[index]
        if op == DELETE:
            return change if self._inside([before[c] for c in key_columns], p) else None  # type: ignore[index]
        if op != UPDATE:
            raise ValueError(f"unknown row change op {op!r} (expected 'c', 'u', 'd' or 's')")
        del_ok = self._inside([before[c] for c in key_columns], p)  # type: ignore[index]
        ups_ok = self._inside([after[c] for c in key_columns], p)  # type: ignore[index]
        return change.halves(del_ok, ups_ok)


__all__ = ["ChunkWindows"]
