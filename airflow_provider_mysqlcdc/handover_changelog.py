"""A table's changelog across a hand-over: no change twice, none missed, no removed row left current.

A hand-over (``pipeline.finalize_run``) pauses the stream at P; a new generation may then replay
from an earlier offset. A re-snapshot or a repair reads rows of a captured table again at a new high
watermark H and swaps them in. For the mirror that is the whole story: it converges whatever it
replays. A changelog, which already holds every change up to P, needs more (docs/architecture.md,
"Changelog"):

* **No change twice.** A new generation replays changes before P (a re-read chunk's from its H; a
  table added behind the stream's checkpoint makes one too): ``CapturedTable.changelog_from``
  (:func:`logged_through`: P, or the end of a batch the pause interrupted after its changelog
  commit) tells it to log only the changes from there on (``Manifest.with_changelog_from``).
* **No change missed.** When H > P the re-read chunks' changes between P and H are in neither the
  old changelog nor, with the chunk's HW at H, the new one: their HW becomes min(H, P)
  (:func:`logged_chunks`), as a partial backfill's does, and the stream applies them over the fresh
  rows (the mirror converges: every image is a whole row). ``finalize_run`` first waits for a
  running stream to pass H, so this is the rare case of a stopped or lagging stream.
* **No removed row left current.** A row the source lost without a binlog event (a cascading
  foreign key, ``sql_log_bin=0``, a restore) is absent from the re-read; the swap removes it from the
  mirror, but the changelog learns of deletes only from the binlog, so its SCD2 view would keep the
  row current. :func:`log_removed_rows` logs such a row as op ``d`` at its chunk's H
  (``_tx_id`` ``snapshot:<plan>:removed``): a key the mirror has in the re-read chunks, the re-read
  lacks, and the binlog did not touch between H and P. A key the binlog touched there is not one:
  the change that touched it is in the changelog and decides its state.

The re-read's rows themselves are the groups' op ``r`` rows at H, as for a first snapshot: a
re-read gives every row it reads a version (as Debezium's re-snapshots emit a read per row).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.changelog import removed_to_changelog, reread_removed_tx
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, FinishedChunk, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.row_digest import normal_key
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.touched_keys import touched_keys
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import append_changes, recorded_version
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import batch_offsets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reread:
    """One table a run reads again while its changelog is on."""

    table: str
    before: CapturedTable  # the entry the stream used until now: its rows are the mirror's
    chunks: list[FinishedChunk]  # every chunk to locate a key in (a repair: the table's; a re-snapshot: the new ones)
    fresh: dict[int, BinlogOffset]  # split id -> H of the chunks read again
    files: list[StagedFile]  # the re-read's staged rows


def logged_through(
    store: StateStore, sink: DeltaSink, manifest: Manifest, table: str, checkpoint: BinlogOffset
) -> BinlogOffset:
    """Where ``table``'s changelog is complete to: the stream's ``checkpoint``, or the end of the
    batch after it when the pause interrupted that batch once its changelog commit was made (the
    same generation would skip it by its batch id; a new one would not)."""
    version = recorded_version(sink, table, manifest.app_id(store.pipeline_id))
    ends = None if version is None else batch_offsets(store, manifest, version)
    return checkpoint if ends is None else max(checkpoint, ends[1])


def logged_chunks(chunks: Iterable[FinishedChunk], pause: BinlogOffset) -> list[FinishedChunk]:
    """The re-read chunks' HWs for the stream: min(H, P), so that their changes from P on — the
    first the changelog lacks — reach it (see the module doc)."""
    return [FinishedChunk(c.chunk, min(c.high_watermark, pause)) for c in chunks]


def log_removed_rows(
    sink: DeltaSink,
    settings: ConnectionSettings | None,
    plan_id: str,
    reread: Reread,
    collations: Mapping[str, Collation],
    pause: BinlogOffset,
    taken_at: Mapping[BinlogOffset, float],
    binlog_kept: bool = True,
) -> int | None:
    """Log the rows the re-read found gone as op ``d`` at their chunk's H, once per plan (before the
    swap, which removes them from the mirror). Returns the rows logged, or None when a retried
    finalize finds them logged already. ``binlog_kept`` False (a recovery from a purged binlog):
    the changes between P and H are gone, so every missing row is one the re-read found gone."""
    marker = reread_removed_tx(plan_id)
    if recorded_version(sink, reread.table, marker) is not None:
        log.info("%s changelog: the rows plan %s found gone are logged already", reread.table, plan_id)
        return None
    schema = cdc_types.arrow_schema(reread.before.schema)
    gone, chunk_hw = _missing_rows(sink, reread, collations, schema)
    if gone.num_rows and binlog_kept:
        gone, chunk_hw = _untouched(settings, reread, gone, chunk_hw, pause)
    if not gone.num_rows:
        log.info("%s: the re-read of plan %s found no row gone from the source", reread.table, plan_id)
        return 0
    logged = []
    for hw in sorted(set(chunk_hw)):
        rows = gone.filter(pa.array([h == hw for h in chunk_hw]))
        logged.append(removed_to_changelog(rows, schema, hw, taken_at.get(hw, time.time()), marker))
    n = append_changes(sink, reread.table, schema, logged, marker, 0)
    log.warning("%s: %s row(s) the lake held are gone from the source with no binlog event (a cascading foreign "
                "key, sql_log_bin=0, a restore?): logged as op d (_tx_id %s) and removed by the swap",
                reread.table, n, marker)  # fmt: skip
    return n


def _missing_rows(
    sink: DeltaSink, reread: Reread, collations: Mapping[str, Collation], schema: pa.Schema
) -> tuple[pa.Table, list[BinlogOffset]]:
    """The mirror's rows in the re-read chunks whose key the re-read lacks, with their chunk's H."""
    key = list(reread.before.merge_key)
    mirror = sink.read(reread.table)
    staged: set[tuple[object, ...]] = set()
    for f in reread.files:
        keys = sink.storage.read_parquet(f.path, columns=key)
        staged.update(normal_key(k) for k in zip(*(keys.column(c).to_pylist() for c in key), strict=True))
    splits = sorted((c.chunk for c in reread.chunks), key=lambda s: s.split_id)
    locator = ChunkLocator(splits, dict(collations))
    chunk_cols = list(splits[0].key_names)
    at = locator.indexes_of([normal_key(k) for k in zip(*(mirror.column(c).to_pylist() for c in chunk_cols),
                                                          strict=True)])  # fmt: skip
    mirror_keys = [normal_key(k) for k in zip(*(mirror.column(c).to_pylist() for c in key), strict=True)]
    keep, hws = [], []
    for i, (k, idx) in enumerate(zip(mirror_keys, at, strict=True)):
        hw = reread.fresh.get(splits[int(idx)].split_id)
        if hw is not None and k not in staged:
            keep.append(i)
            hws.append(hw)
    rows = mirror.take(pa.array(np.asarray(keep, dtype=np.int64))).select(schema.names).cast(schema)
    return rows, hws


def _untouched(
    settings: ConnectionSettings | None, reread: Reread, rows: pa.Table, hws: Sequence[BinlogOffset],
    pause: BinlogOffset,
) -> tuple[pa.Table, list[BinlogOffset]]:  # fmt: skip
    """``rows`` whose key the binlog did not touch between their chunk's H and P (either order)."""
    if settings is None:
        raise ValueError(
            f"{reread.table} has a changelog and is read again: finalize needs the source connection to tell the "
            "rows the source lost without a binlog event from those the binlog changed (pass settings)"
        )
    key = list(reread.before.merge_key)
    lo, hi = min(min(hws), pause), max(max(hws), pause)
    touched = touched_keys(settings, {reread.table: reread.before}, {reread.table: key}, lo, hi)[reread.table]
    keep, out_hws = [], []
    keys = zip(*(rows.column(c).to_pylist() for c in key), strict=True)
    for i, (k, hw) in enumerate(zip(keys, hws, strict=True)):
        start, end = min(hw, pause), max(hw, pause)
        if not any(start <= at < end for at in touched.get(normal_key(k), ())):
            keep.append(i)
            out_hws.append(hw)
    return rows.take(pa.array(np.asarray(keep, dtype=np.int64))), out_hws


__all__ = ["Reread", "log_removed_rows", "logged_chunks", "logged_through"]
