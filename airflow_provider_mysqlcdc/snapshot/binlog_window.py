"""Replay a chunk group's binlog window ``[LW, HW)`` onto its staged chunk files, in bounded memory.

Step 4 of the watermark bracket (``snapshot/group.py``): the rows the group staged were read at
some point between LW and HW, so every key the window touches may be stale in them. A chunk whose
reader took its own watermarks (``TableWork.windows``) takes only the changes of its own window
(``core/chunk_window.py``); the others take the group's; a chunk whose task already replayed its
own window (``TableWork.replayed``, ``snapshot/chunk_replay.py``) takes none. Per table:

1. the window's changes are decoded once (the stream's reader and decoder, key-only before
   images) into change blocks and folded by key (``spill/bucketed_fold.py``): the last image of
   every touched key, or its deletion. A window holding a huge transaction is folded in hash
   buckets spilled to local scratch files, so memory stays within ``memory_bytes``;
2. every touched key is stale: a staged row with one of those exact key values is dropped (the
   SELECT saw one of its versions, whatever the collation says about case or trailing spaces) —
   the changed keys spill too and are matched pass by pass (``spill/changed_keys.py``);
3. each last after-image is placed into its chunk in the database's own key order
   (:class:`~airflow_provider_mysqlcdc.core.chunk.ChunkLocator`); only chunks of this group take it, the
   others are other groups' business;
4. every chunk with a dropped row or a new image is rewritten, streamed row group by row group.

Every chunk of the group then holds its rows as of HW.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_mysqlcdc.core.change_block import BlockBuilder, block_schema
from airflow_provider_mysqlcdc.core.chunk_window import ChunkWindows
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.mysql import binlog_values
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.rows_decoder import key_image_columns
from airflow_provider_mysqlcdc.spill.bucketed_fold import BucketedFold, buckets_for
from airflow_provider_mysqlcdc.spill.changed_keys import ChangedKeys, match_files

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.snapshot.staging import TableWork as _TableWork

log = logging.getLogger(__name__)

BLOCK_ROWS = 8192
READ_BATCH_ROWS = 65_536


def replay_window(
    settings: ConnectionSettings,
    low: BinlogOffset,
    high: BinlogOffset,
    work: Sequence[_TableWork],
    *,
    server_id: int,
    window_bytes: int,
    memory_bytes: int,
    scratch_dir: str | None = None,
    threads: int = 2,
) -> int:
    """Apply ``[low, high)`` to the group's staged files (``w.files`` of each table is updated).

    ``server_id`` is the replication id of the window's reader: the group's own
    (``ServerIdLayout.group_id``, ``core/server_ids.py``).
    ``window_bytes`` (the binlog bytes of the window) sizes the fold's buckets; ``threads`` chunk
    files are matched and rewritten at once. Returns the number of changes replayed: those of the
    window that fall in some chunk's window (the group's, or a chunk's own).
    """
    # chunks whose task replayed their own window (snapshot/chunk_replay.py) are done; so is a table
    # with nothing else, and a group with nothing else reads no binlog at all
    by_table = {w.table: w for w in work if any(s.split_id not in w.replayed for s in w.splits)}
    if not by_table:
        return 0
    if scratch_dir:
        os.makedirs(scratch_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="mysqlcdc-window-", dir=scratch_dir)
    buckets = buckets_for(window_bytes, memory_bytes)
    if buckets > 1:
        log.info("binlog window %s..%s: %.1f MiB of binlog, folded in %d buckets within %d MiB", low, high,
                 window_bytes / 2**20, buckets, memory_bytes >> 20)  # fmt: skip
    folds = {t: BucketedFold(w.pk_cols, buckets, os.path.join(workdir, f"fold-{i}"))
             for i, (t, w) in enumerate(by_table.items())}  # fmt: skip
    before_cols = {t: key_image_columns(w.pk_cols, w.chunk_cols) for t, w in by_table.items()}
    builders = {t: BlockBuilder(block_schema(w.arrow_schema, before_cols[t])) for t, w in by_table.items()}
    converters = {t: binlog_values.binlog_row_converter(w.schema) for t, w in by_table.items()}
    windows = {t: ChunkWindows(w.locator, {s.split_id: w.windows.get(s.split_id, (low, high)) for s in w.splits
                                           if s.split_id not in w.replayed})
               for t, w in by_table.items() if w.windows}  # fmt: skip
    n = kept = 0
    try:
        reader = BinlogRangeReader(
            settings, low, high, tables=list(by_table), server_id=server_id,
            convert=lambda t, values, none_sources: converters[t](values, none_sources),
            # The generated decoder (library fallback per table map); before images need the keys only.
            schemas={t: w.schema for t, w in by_table.items()}, key_columns=before_cols,
        )  # fmt: skip
        try:
            for ch in reader:
                b = builders.get(ch.table)
                if b is None:
                    continue
                n += 1
                own = windows.get(ch.table)
                if own is not None:
                    ch = own.part(ch, by_table[ch.table].chunk_cols)
                    if ch is None:  # older than its chunk's read, or the stream's (newer than its HW)
                        continue
                tx = ch.tx_offset
                b.add(ch.op, tx.file, tx.pos, ch.event_pos[0], ch.event_pos[1], ch.row_index, kept,
                      int(ch.commit_ts), ch.before, ch.after)  # fmt: skip
                kept += 1
                if len(b) >= BLOCK_ROWS:
                    folds[ch.table].add(b.build())
        finally:
            reader.close()
        for t, b in builders.items():
            if len(b):
                folds[t].add(b.build())
        log.info("binlog window %s..%s: %d changes to the group's tables, %d of them inside their chunk's "
                 "window", low, high, n, kept)  # fmt: skip
        for t, w in by_table.items():
            if folds[t].changes:
                rewritten = _apply_to_chunks(w, folds[t], os.path.join(workdir, f"apply-{t}"), memory_bytes, threads)
                log.info("%s: %d of %d staged chunk files brought to their HW (%d chunks with their own window)",
                         t, rewritten, len(w.files), len(w.windows))  # fmt: skip
    finally:
        for f in folds.values():
            f.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return kept


def _apply_to_chunks(w: _TableWork, fold: BucketedFold, workdir: str, memory_bytes: int, threads: int) -> int:
    """Rewrite the chunk files the fold touches; returns how many."""
    os.makedirs(workdir, exist_ok=True)
    group_ids = {s.split_id for s in w.splits}
    key_schema = pa.schema([w.arrow_schema.field(c) for c in w.pk_cols])
    keys = ChangedKeys(key_schema, os.path.join(workdir, "keys"), max(1, memory_bytes // 2))
    adds: dict[int, tuple[Any, pa.ipc.RecordBatchFileWriter]] = {}  # split -> (sink, writer) of its new images
    added = dict.fromkeys(group_ids, 0)
    try:
        for fb in fold.buckets():
            keys.add(fb.changed_keys(key_schema))
            up = fb.upserts
            if not up.num_rows:
                continue
            up = up.select(w.arrow_schema.names).cast(w.arrow_schema)
            chunk_keys = [list(r.values()) for r in up.select(w.chunk_cols).to_pylist()]
            w.locator.order.prefetch(chunk_keys)
            sids = np.fromiter((w.locator.locate(k).split_id for k in chunk_keys), dtype=np.int64, count=up.num_rows)
            for sid in np.unique(sids):
                if int(sid) not in group_ids:
                    continue  # a key now in another group's chunk: that group's window places it
                part = up.filter(pa.array(sids == sid))
                if int(sid) not in adds:
                    sink = pa.OSFile(os.path.join(workdir, f"adds-{int(sid)}.arrow"), "wb")
                    adds[int(sid)] = (sink, pa.ipc.new_file(sink, w.arrow_schema))
                adds[int(sid)][1].write_table(part)
                added[int(sid)] += part.num_rows
    finally:
        for sink, writer in adds.values():
            writer.close()
            sink.close()
    stale: dict[int, np.ndarray] = {}
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for group in keys.passes():
            files = [(sid, lambda f=f: w.storage.read_parquet(f.path, columns=w.pk_cols)) for sid, f in w.files.items()]
            for sid, hit in match_files(files, group.combine_chunks(), w.pk_cols, max(1 << 20, keys.budget // 2)):
                if hit.any():
                    stale[sid] = stale[sid] | hit if sid in stale else hit
        todo = sorted(set(stale) | {s for s, k in added.items() if k})
        jobs = [(sid, stale.get(sid), os.path.join(workdir, f"adds-{sid}.arrow") if added[sid] else None)
                for sid in todo]  # fmt: skip
        new_files = list(pool.map(lambda j: _rewrite_chunk(w, *j), jobs))
    for sid, f in zip(todo, new_files, strict=True):
        w.files[sid] = f
    return len(todo)


def _rewrite_chunk(w: _TableWork, split_id: int, drop: np.ndarray | None, adds_path: str | None) -> StagedFile:
    """Replace a staged chunk file by its state as of HW: without its stale rows, with its new images."""
    old = w.files.get(split_id)
    path = f"{_local(w.staging)}/chunk-{split_id:06d}-{uuid.uuid4().hex[:8]}.parquet"
    rows = 0
    # Dictionary encoding halves the rewrite's speed for the high-cardinality columns snapshot
    # tables are made of (bench/RESULTS.md), so it is off.
    with w.storage.open(path, "wb") as sink, pq.ParquetWriter(sink, w.arrow_schema, use_dictionary=False) as out:
        if old is not None:
            offset = 0
            for batch in w.storage.parquet_file(old.path).iter_batches(batch_size=READ_BATCH_ROWS):
                part = pa.Table.from_batches([batch]).select(w.arrow_schema.names).cast(w.arrow_schema)
                if drop is not None:
                    part = part.filter(pa.array(~drop[offset : offset + batch.num_rows]))
                offset += batch.num_rows
                if part.num_rows:
                    out.write_table(part)
                    rows += part.num_rows
        if adds_path is not None:
            with pa.OSFile(adds_path, "rb") as src:
                reader = pa.ipc.open_file(src)
                for i in range(reader.num_record_batches):
                    batch = reader.get_batch(i)
                    out.write_table(pa.Table.from_batches([batch]))
                    rows += batch.num_rows
    if old is not None:
        w.storage.remove(old.path)
    return StagedFile(path, rows, w.storage.size(path), [split_id])


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


__all__ = ["replay_window"]
