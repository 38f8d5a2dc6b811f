"""Fold a table's changes in bounded memory: hash buckets of keys, spilled to scratch files.

Why: one transaction can change millions of rows, and a micro-batch (or a snapshot group's binlog
window) always holds whole transactions. The package's one fold,
:func:`~airflow_provider_mysqlcdc.core.change_block.fold_block`, needs every change it folds in
memory at once; this splits the changes by a hash of their key first and calls it on each bucket
alone, so only one bucket is in memory at a time. Every change of a key lands in that key's bucket
— an update that moves a row to another key lands in both its old key's bucket (where it deletes)
and its new key's (where it upserts) — so folding the buckets one by one gives exactly what folding
everything at once gives (tests/unit/spill/test_bucketed_fold.py checks it).

The scratch files are Arrow IPC files in a private local directory (the caller's), deleted with
it; with one bucket nothing is written and the fold is the in-memory one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core.change_block import fold_block
from airflow_provider_mysqlcdc.core.key_buckets import key_buckets

#: Folding a bucket takes about this many times the bucket's Arrow bytes at its peak (the sorted
#: copy, the key events and the taken after images live next to the input).
FOLD_MEMORY_FACTOR = 4
MAX_BUCKETS = 4096


def buckets_for(change_bytes: int, memory_bytes: int) -> int:
    """How many buckets keep one bucket's fold within ``memory_bytes``."""
    if memory_bytes <= 0:
        raise ValueError(f"memory_bytes must be > 0, got {memory_bytes}")
    return max(1, min(MAX_BUCKETS, math.ceil(change_bytes * FOLD_MEMORY_FACTOR / memory_bytes)))


@dataclass(frozen=True)
class FoldedBucket:
    """The fold of one bucket: ``upserts`` (full rows) and ``delete_keys``; each key in one of them."""

    index: int
    upserts: pa.Table
    delete_keys: pa.Table

    def changed_keys(self, key_schema: pa.Schema) -> pa.Table:
        """Every key the bucket touches (an upsert's or a delete's), typed like ``key_schema``."""
        names = key_schema.names
        return pa.concat_tables([self.upserts.select(names).cast(key_schema), self.delete_keys.cast(key_schema)])


class BucketedFold:
    """Collect change blocks of ONE table (``core/change_block.py`` layout), then fold bucket by bucket.

    ``add`` routes each change to the bucket of its key (and of its old key, for an update that
    moved it) and appends it to that bucket's scratch file; :meth:`buckets` yields each bucket's
    fold, keeping only the keys that belong to it. Changes may be added in any order: the fold
    orders them by ``seq``.
    """

    def __init__(self, primary_key: Sequence[str], buckets: int, workdir: str | None = None,
                 with_metadata: bool = False):  # fmt: skip
        if not primary_key:
            raise ValueError("a fold needs the primary key columns")
        if buckets > 1 and not workdir:
            raise ValueError("a fold in several buckets needs a scratch directory")
        self.primary_key = list(primary_key)
        self.bucket_count = max(1, int(buckets))
        self.workdir = workdir
        self.with_metadata = with_metadata  # upserts carry the winning change's metadata columns
        self.changes = 0
        self._memory: list[pa.RecordBatch] = []
        self._writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
        self._sinks: dict[int, pa.NativeFile] = {}
        self._schema: pa.Schema | None = None

    # ------------------------------------------------------------------ collecting
    def add(self, block: pa.RecordBatch | pa.Table) -> None:
        batches = block.to_batches() if isinstance(block, pa.Table) else [block]
        for batch in batches:
            if not batch.num_rows:
                continue
            if self._schema is None:
                self._schema = batch.schema
            elif batch.schema != self._schema:
                batch = pa.Table.from_batches([batch]).cast(self._schema).combine_chunks().to_batches()[0]
            self.changes += batch.num_rows
            if self.bucket_count == 1:
                self._memory.append(batch)
                continue
            for k, idx in self._route(batch):
                self._writer(k).write_batch(batch.take(pa.array(idx)))

    def _route(self, batch: pa.RecordBatch) -> Iterator[tuple[int, np.ndarray]]:
        """(bucket, row indexes) pairs: each row to its after key's bucket and its before key's."""
        after, before = batch.column("after"), batch.column("before")
        has_after = np.asarray(after.is_valid())
        has_before = np.asarray(before.is_valid())
        ab = key_buckets([pc.struct_field(after, c) for c in self.primary_key], self.bucket_count)
        bb = key_buckets([pc.struct_field(before, c) for c in self.primary_key], self.bucket_count)
        rows = np.arange(batch.num_rows, dtype=np.int64)
        extra = has_before & (~has_after | (bb != ab))
        idx = np.concatenate([rows[has_after], rows[extra]])
        bucket = np.concatenate([ab[has_after], bb[extra]])
        order = np.lexsort((idx, bucket))
        idx, bucket = idx[order], bucket[order]
        cuts = np.flatnonzero(np.diff(bucket)) + 1
        for part_idx, part_bucket in zip(np.split(idx, cuts), np.split(bucket, cuts), strict=True):
            if len(part_idx):
                yield int(part_bucket[0]), part_idx

    def _writer(self, k: int) -> pa.ipc.RecordBatchFileWriter:
        w = self._writers.get(k)
        if w is None:
            assert self.workdir is not None and self._schema is not None
            os.makedirs(self.workdir, exist_ok=True)
            sink = pa.OSFile(os.path.join(self.workdir, f"bucket-{k:05d}.arrow"), "wb")
            w = self._writers[k] = pa.ipc.new_file(sink, self._schema)
            self._sinks[k] = sink
        return w

    # ------------------------------------------------------------------ folding
    def buckets(self) -> Iterator[FoldedBucket]:
        """Each non-empty bucket's fold, one at a time (only one bucket is read at once)."""
        if self.bucket_count == 1:
            if self._memory:
                data = pa.Table.from_batches(self._memory).sort_by("seq")
                self._memory = []
                up, dels = fold_block(data, self.primary_key, self.with_metadata)
                yield FoldedBucket(0, up, dels)
            return
        self._close_writers()
        for k in sorted(self._sinks):
            path = os.path.join(self.workdir or "", f"bucket-{k:05d}.arrow")
            with pa.memory_map(path) as src:
                data = pa.ipc.open_file(src).read_all()
            data = data.sort_by("seq")
            up, dels = fold_block(data, self.primary_key, self.with_metadata)
            del data
            os.remove(path)
            up = up.filter(pa.array(key_buckets([up.column(c) for c in self.primary_key], self.bucket_count) == k))
            dels = dels.filter(
                pa.array(key_buckets([dels.column(c) for c in self.primary_key], self.bucket_count) == k)
            )
            yield FoldedBucket(k, up, dels)

    def _close_writers(self) -> None:
        for w in self._writers.values():
            w.close()
        for s in self._sinks.values():
            s.close()
        self._writers = {}

    def close(self) -> None:
        """Drop the scratch files (also when the fold was abandoned half-way)."""
        self._close_writers()
        for k in list(self._sinks):
            path = os.path.join(self.workdir or "", f"bucket-{k:05d}.arrow")
            if os.path.exists(path):
                os.remove(path)
        self._sinks = {}
        self._memory = []


__all__ = ["FOLD_MEMORY_FACTOR", "BucketedFold", "FoldedBucket", "buckets_for"]
