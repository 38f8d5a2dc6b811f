"""The set of keys a batch changed, kept within a memory budget, and matching rows against it.

Why: applying a batch means dropping every existing row whose key the batch changed (a sink's data
file, a snapshot chunk's staged file) before the new images go in. A transaction of millions of
rows changes millions of keys, so the set spills to scratch files beyond its budget and is matched
in passes, each pass a group of keys that fits. Keys are compared by exact value, as the MERGE's
join does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

T = TypeVar("T")


@dataclass
class ChangedKeys:
    """The keys a batch changed, added bucket by bucket: in memory up to ``budget`` bytes, then all of
    them in scratch files under ``workdir``; :meth:`passes` hands them back in groups that fit."""

    schema: pa.Schema
    workdir: str
    budget: int
    memory: list[pa.Table] = field(default_factory=list)
    files: list[tuple[str, int]] = field(default_factory=list)  # (path, bytes in memory)
    memory_bytes: int = 0
    count: int = 0

    def add(self, keys: pa.Table) -> None:
        if not keys.num_rows:
            return
        self.count += keys.num_rows
        if self.memory_bytes + keys.nbytes <= self.budget and not self.files:
            self.memory.append(keys)
            self.memory_bytes += keys.nbytes
            return
        os.makedirs(self.workdir, exist_ok=True)
        for t in [*self.memory, keys]:  # over budget: everything goes to scratch files
            path = os.path.join(self.workdir, f"keys-{len(self.files):05d}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
                w.write_table(t)
            self.files.append((path, t.nbytes))
        self.memory, self.memory_bytes = [], 0

    def passes(self) -> Iterator[pa.Table]:
        """The keys in groups that each fit the budget (one group when everything is in memory)."""
        if not self.files:
            if self.memory:
                yield pa.concat_tables(self.memory)
            return
        group: list[str] = []
        size = 0
        for path, nbytes in self.files:
            if group and size + nbytes > self.budget:
                yield self._load(group)
                group, size = [], 0
            group.append(path)
            size += nbytes
        if group:
            yield self._load(group)

    @staticmethod
    def _load(paths: list[str]) -> pa.Table:
        tables = []
        for p in paths:
            with pa.OSFile(p, "rb") as src:
                tables.append(pa.ipc.open_file(src).read_all())
        return pa.concat_tables(tables)


def member_mask(file_keys: pa.Table, changed: pa.Table, key: list[str]) -> np.ndarray:
    """Which rows of ``file_keys`` have a key in ``changed`` (exact values, like the MERGE's join)."""
    if not file_keys.num_rows:
        return np.zeros(0, dtype=bool)
    if len(key) == 1:
        col = file_keys.column(key[0]).cast(changed.schema.field(key[0]).type)
        return np.asarray(pc.is_in(col, value_set=changed.column(key[0])).combine_chunks(), dtype=bool)
    left = file_keys.cast(changed.schema).append_column("__row", pa.array(np.arange(file_keys.num_rows)))
    hits = left.join(changed, keys=key, join_type="left semi").column("__row")
    mask = np.zeros(file_keys.num_rows, dtype=bool)
    mask[np.asarray(hits.combine_chunks())] = True
    return mask


def match_files(
    files: Iterable[tuple[T, Callable[[], pa.Table]]], changed: pa.Table, key: list[str], batch_bytes: int
) -> Iterator[tuple[T, np.ndarray]]:
    """``(file, mask)`` for each ``(file, read its key columns)``: which of its rows have a changed key.

    Arrow builds a hash table of ``changed`` on every membership call, so files are matched
    together, up to ``batch_bytes`` of their keys per call, not one call per file.
    """
    pending: list[tuple[T, pa.Table]] = []
    size = 0
    for ident, read in files:
        keys = read()
        pending.append((ident, keys))
        size += keys.nbytes
        if size >= batch_bytes:
            yield from _match_pending(pending, changed, key)
            pending, size = [], 0
    if pending:
        yield from _match_pending(pending, changed, key)


def _match_pending(
    pending: list[tuple[T, pa.Table]], changed: pa.Table, key: list[str]
) -> Iterator[tuple[T, np.ndarray]]:
    tables = [t.select(key).cast(changed.schema) for _, t in pending]
    mask = member_mask(pa.concat_tables(tables) if len(tables) > 1 else tables[0], changed, key)
    offset = 0
    for (ident, _), t in zip(pending, tables, strict=True):
        yield ident, mask[offset : offset + t.num_rows]
        offset += t.num_rows


__all__ = ["ChangedKeys", "match_files", "member_mask"]
