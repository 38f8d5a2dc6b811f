"""Apply one micro-batch of the stream to the Delta tables: the ``foreachBatch`` body.

Why a class of its own: the query loop (``stream/job.py``) only starts, stops and restarts the
query; everything a batch does — decode its change blocks, fold each table's changes to the last
change per key, apply them as one commit per table tagged ``(app_id, batch_id)``, report progress
and status, maintain the tables between batches — happens here, in the driver's Python. A table's
changes too large to fold in memory take the bounded path: a bucketed fold spilled to local
scratch space and a copy-on-write rewrite in one commit (docs/architecture.md, "Large
transactions").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.core.change_block import changes_after, fold_block
from airflow_provider_mysqlcdc.core.changelog import changes_to_changelog
from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.stream_state import StreamStatus
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import append_changes
from airflow_provider_mysqlcdc.sinks.delta_merge import replace_rows
from airflow_provider_mysqlcdc.sinks.delta_rewrite import apply_folded_changes
from airflow_provider_mysqlcdc.sinks.delta_small_table import sweep_superseded
from airflow_provider_mysqlcdc.spill.bucketed_fold import FOLD_MEMORY_FACTOR, BucketedFold, buckets_for
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.apply_processes import ApplyProcesses, ApplySpec
from airflow_provider_mysqlcdc.stream.batch_progress import BatchProgress
from airflow_provider_mysqlcdc.stream.batch_stop import stop_for_ddl
from airflow_provider_mysqlcdc.stream.checkpoint_copy import CheckpointCopy
from airflow_provider_mysqlcdc.stream.emptied_rows import removed_rows_changelog
from airflow_provider_mysqlcdc.stream.maintenance_rounds import MaintenanceRounds
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from airflow_provider_mysqlcdc.stream.schema_follow import (
    SchemaChangeReached,
    StreamSchemaError,
    stop_before_unfollowed_ddl,
)
from airflow_provider_mysqlcdc.stream.staged_blocks import read_staged_blocks, remove_batch
from airflow_provider_mysqlcdc.stream.table_apply import TableChangeApplier

log = logging.getLogger(__name__)


class BatchApplier:
    """``foreachBatch`` body: decode, fold per table, MERGE into Delta idempotently, report status.

    A table's changes of one batch are applied in memory (fold + one delta-rs MERGE) when they are
    small, and in bounded memory (bucketed fold + copy-on-write rewrite, one commit) when a task
    staged them or they would need more than ``apply_memory_mb`` to fold: a transaction of any size
    applies without the driver holding it. The in-memory tables of a batch are applied by up to
    ``apply_threads`` threads at once when their folds fit ``apply_memory_mb`` together: tables are
    independent (own commit, own batch id record), and delta-rs releases the GIL while it writes.
    """

    def __init__(
        self,
        store: StateStore,
        sink: DeltaSink,
        manifest: Manifest,
        options: StreamOptions | None = None,
        staging: str | None = None,
        checkpoint: CheckpointCopy | None = None,
        processes: ApplyProcesses | None = None,
        on_ddl: Callable[[], None] | None = None,
    ):
        self.store = store
        # asks the query loop to stop the query when a batch meets an unfollowed DDL (stream/batch_stop.py)
        self.on_ddl = on_ddl
        self.checkpoint = checkpoint
        self.sink = sink
        sink.rewrite_below_bytes = (options or StreamOptions()).rewrite_below_mb << 20
        sink.deletion_vectors = (options or StreamOptions()).deletion_vectors
        sink.keep_superseded_for((options or StreamOptions()).small_table_retention())
        self.manifest = manifest
        self.options = options or StreamOptions()
        self.staging = staging
        self.app_id = manifest.app_id(store.pipeline_id)
        self.tables = TableChangeApplier(sink, manifest, self.app_id)  # stream/table_apply.py
        self.schemas, self.arrow, self.lake = self.tables.schemas, self.tables.arrow, self.tables.lake
        self.metadata, self.pks = self.tables.metadata, self.tables.pks
        # apply processes owning shares of the tables (stream/apply_processes.py); None: this driver's threads
        self.processes = processes
        if processes is not None:
            processes.configure(ApplySpec.of(sink, manifest, self.app_id, self.options.apply_threads, processes.count))
        self.schema_positions = {t: e.schema_position for t, e in manifest.tables.items() if e.schema_position}
        for t, r in manifest.refused.items():  # created while streaming and refused: that CREATE is done with
            self.schema_positions.setdefault(t, BinlogOffset.from_dict(r["offset"]))
        # offsets where a followed TRUNCATE/DROP emptied a table (policy evolve, stream/schema_follow.py)
        self.emptied = {t: {o.sort_key() for o in e.emptied_at} for t, e in manifest.tables.items() if e.emptied_at}
        # offsets where a table continued from its shadow table's rows (an online schema change's cut-over)
        self.replaced = {t: {o.sort_key(): src for o, src in e.replaced_from}
                         for t, e in manifest.tables.items() if e.replaced_from}  # fmt: skip
        self.batches = 0
        # what the status file says between batches; a large batch's progress is written on top of it
        self.last_status = replace(store.read_status(), current_batch=None)
        self.maintenance = MaintenanceRounds(sink, self.options.maintenance,
                                             max(0.05, self.options.trigger_seconds / 4))  # fmt: skip

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        if self.checkpoint is not None:  # the batch's offsets reach the store before any Delta commit
            self.checkpoint.push()
        try:
            with BatchProgress(self.store, self.manifest, batch_id, self.staging, self.last_status) as progress:
                data = batch_df.toArrow() if hasattr(batch_df, "toArrow") else pa.Table.from_pandas(batch_df.toPandas())
                self.apply_arrow(data, batch_id, t0, progress, read_seconds=time.monotonic() - t0)
        except SchemaChangeReached as reached:  # nothing applied: stop the query quietly, the batch runs again
            if self.on_ddl is None:
                raise
            stop_for_ddl(batch_df.sparkSession._jvm, self.on_ddl, reached)
        sweep_superseded(self.sink)  # the files of small tables this batch did not commit to, past their grace
        self.maintain_if_due()

    def maintain_if_due(self, force: bool = False) -> dict[str, Any] | None:
        """Compact, checkpoint and vacuum the stream's tables: a round every
        ``maintenance.interval_seconds``, spread over the pauses between batches (at most a quarter
        of the trigger interval each; ``force``: the whole round now). The round's summary when one
        ended, else None. A failure is logged and recorded in the status, never fatal.
        """
        targets = {self.sink.table_uri(t): t for t in sorted(self.schemas, reverse=True)}  # routed shards: once

        def orphans() -> bool:  # no snapshot staging in flight: unreferenced files may go
            pointer = self.store.read_plan_pointer()
            return pointer is None or pointer.finalized

        summary = self.maintenance.step(targets.values(), orphans, force)
        if summary is not None:
            self.last_status = replace(self.last_status, maintenance=summary)
            self.store.write_status(self.last_status)
        return summary

    def apply_arrow(
        self, data: pa.Table, batch_id: int, t0: float | None = None, progress: BatchProgress | None = None,
        read_seconds: float | None = None,
    ) -> dict[str, int]:
        """Apply one micro-batch (``mysql_binlog`` output: change blocks) to the Delta tables.

        Per table the blocks are decoded and folded with Arrow kernels
        (:func:`~airflow_provider_mysqlcdc.core.change_block.fold_block`, the one fold of the package)
        into upserts and delete keys, then applied as one commit tagged ``(app_id, batch_id)``.
        """
        t0 = t0 if t0 is not None else time.monotonic()
        cuts: dict[str, list[tuple[BinlogOffset, int]]] = {}
        swaps: dict[str, tuple[BinlogOffset, str]] = {}
        blobs: dict[str, list[bytes]] = defaultdict(list)
        staged: dict[str, list[dict[str, Any]]] = defaultdict(list)
        counts: dict[str, int] = defaultdict(int)
        last_event: BinlogOffset | None = None
        last_commit_ts = 0
        if data.num_rows:
            stop_before_unfollowed_ddl(self.store, data, batch_id, self.schema_positions)
            meta = data.select(["tbl", "kind", "rows", "file", "pos", "commit_ts", "info"]).to_pylist()
            cuts = self._empty_points(meta)
            swaps = self._cut_overs(meta)
            # rows of a table before its cut-over were decoded with the new definition and are dropped
            invalid = [r for r in meta if r["kind"] == "invalid" and r["tbl"] in self.arrow
                       and not _before_cut_over(r, swaps)]  # fmt: skip
            if invalid:
                r = invalid[0]
                raise StreamSchemaError(
                    f"batch {batch_id}: changes of {r['tbl']} up to {r['file']}:{r['pos']} do not fit the table's "
                    f"schema in the stream manifest ({json.loads(r['info'])['error']}) and the batch holds no DDL "
                    "that explains it: the table was altered in a way the binlog does not show to the stream. "
                    f"Re-snapshot it (trigger the DAG with resnapshot_tables=['{r['tbl']}'])"
                )
            block_col = data.column("block")
            for i, r in enumerate(meta):
                t = r["tbl"]
                if r["kind"] not in ("rows", "staged") or t not in self.arrow:
                    continue
                if r["kind"] == "rows":
                    blobs[t].append(block_col[i].as_py())
                else:
                    staged[t].append(json.loads(r["info"]))
                counts[t] += int(r["rows"])
                at = BinlogOffset(r["file"], int(r["pos"]))
                if last_event is None or at > last_event:
                    last_event = at
                last_commit_ts = max(last_commit_ts, int(r["commit_ts"] or 0))
        if progress is not None:
            progress.phase("applying", rows_decoded=sum(counts.values()))
        memory = self.options.apply_memory_mb << 20
        bounded: dict[str, dict[str, Any]] = {}
        in_memory: list[str] = []
        needed = 0
        for t, (cut, src) in sorted(swaps.items()):
            # the shadow's last changes first: its rows are copied next
            if src in staged:
                nbytes = sum(len(b) for b in blobs.get(src, [])) + sum(int(f["bytes"]) for f in staged[src])
                self._apply_bounded(src, blobs.pop(src, []), staged.pop(src), nbytes, batch_id, progress)
            elif src in blobs:
                self._apply_in_memory(src, blobs.pop(src), batch_id)
            self._apply_cut_over(t, src, blobs.pop(t, []), staged.pop(t, []), cut, batch_id)
        for t, points in sorted(cuts.items()):
            self._apply_emptied(t, blobs.pop(t, []), staged.pop(t, []), points, batch_id)
        for t in sorted(set(blobs) | set(staged)):
            nbytes = sum(len(b) for b in blobs[t]) + sum(int(f["bytes"]) for f in staged[t])
            if staged[t] or nbytes * FOLD_MEMORY_FACTOR > memory:
                bounded[t] = self._apply_bounded(t, blobs[t], staged[t], nbytes, batch_id, progress)
            else:
                in_memory.append(t)
                needed += nbytes * FOLD_MEMORY_FACTOR
        # several tables at once only while their folds fit the memory one table may use
        # routed shards of one Delta table (core/routing.py) go one after the other: one writer per table
        units = self.tables.units(in_memory)
        work = {t: blobs[t] for t in in_memory}
        t_apply = time.monotonic()
        if self.processes is not None and units:
            self.processes.apply(batch_id, work, units, parallel=needed <= memory)
        else:
            self.tables.apply_all(work, batch_id, self.options.apply_threads if needed <= memory else 1)
        apply_seconds = time.monotonic() - t_apply
        lag = round(time.time() - last_commit_ts, 3) if last_commit_ts else None
        large_batch = None
        if progress is not None and progress.announced:
            snap = progress.snapshot()
            large_batch = {k: v for k, v in snap.items() if k in ("start", "end", "binlog_bytes")}
        status = StreamStatus.finished(
            batch_id,
            sum(counts.values()),
            dict(counts),
            last_event,
            lag,
            seconds=round(time.monotonic() - t0, 3),
            updated_at=time.time(),
            bounded_apply=bounded,
            large_batch=large_batch,
            maintenance=self.last_status.maintenance,
        )
        self.store.write_status(status)
        self.last_status = status
        if self.staging:  # the batch's staged blocks and progress files are never read again
            done = {f["path"].rsplit("/", 2)[-2] for fs in staged.values() for f in fs}
            if progress is not None and progress.announced and progress.snapshot().get("key"):
                done.add(progress.snapshot()["key"])
            for key in done:
                remove_batch(self.staging, key, self.store.storage)
        lag_text = f"lag {lag}s" if lag is not None else "no changes"
        per_table = f" {dict(counts)}" if len(counts) <= 8 else ""
        read_text = f"read {read_seconds:.2f}s, " if read_seconds is not None else ""
        by = f" by {self.processes.count} processes" if self.processes is not None else ""
        log.info("batch %d: %s rows over %d tables%s, %s, %.2fs (%sin-memory tables applied in %.2fs%s)",
                 batch_id, status.rows, len(counts), per_table, lag_text, status.seconds, read_text, apply_seconds,
                 by)  # fmt: skip
        self.batches += 1
        return dict(counts)

    def _empty_points(self, meta: list[dict[str, Any]]) -> dict[str, list[tuple[BinlogOffset, int]]]:
        """Per table, the DDL of this batch at which the table is emptied (a followed TRUNCATE or DROP
        under policy evolve), with their commit times, in binlog order."""
        cuts: dict[str, dict[BinlogOffset, int]] = defaultdict(dict)
        for r in meta:
            t = r["tbl"]
            if r["kind"] == "ddl" and t in self.emptied:
                at = BinlogOffset(r["file"], int(r["pos"]))
                if at.sort_key() in self.emptied[t]:
                    cuts[t][at] = int(r["commit_ts"] or 0)
        return {t: sorted(points.items()) for t, points in cuts.items()}

    def _cut_overs(self, meta: list[dict[str, Any]]) -> dict[str, tuple[BinlogOffset, str]]:
        """Per table, the cut-over of this batch at which it continues from its shadow table."""
        out: dict[str, tuple[BinlogOffset, str]] = {}
        for r in meta:
            t = r["tbl"]
            if r["kind"] == "ddl" and t in self.replaced:
                at = BinlogOffset(r["file"], int(r["pos"]))
                src = self.replaced[t].get(at.sort_key())
                if src is not None:
                    out[t] = (at, src)
        return out

    def _apply_cut_over(
        self, table: str, source: str, blobs: list[bytes], staged: list[dict[str, Any]], cut: BinlogOffset,
        batch_id: int,
    ) -> None:
        """``table`` continues from ``source``'s rows at ``cut`` (a gh-ost / pt-osc cut-over): copy them
        in (one commit), then apply ``table``'s changes after ``cut`` (one MERGE carrying the batch id).
        A replay that finds the batch id skips both; one that does not redoes both (the copy is the
        same rows again)."""
        done = self.sink.open(table).transaction_version(self.app_id)
        if done is not None and done >= batch_id:
            log.info("batch %d: %s: cut-over already applied; skipped", batch_id, table)
            return
        self.sink.copy_rows(source, table)
        block = _changes_after(self._blocks(blobs, staged), cut)
        if block is not None:
            upserts, delete_keys = fold_block(block, self.pks[table], table in self.metadata)
            self.sink.apply_changes(table, upserts.cast(self.lake[table]), delete_keys, self.pks[table], self.app_id,
                                    batch_id)  # fmt: skip
        log.info("batch %d: %s continued from %s at %s", batch_id, table, source, cut)

    def _apply_emptied(
        self,
        table: str,
        blobs: list[bytes],
        staged: list[dict[str, Any]],
        points: list[tuple[BinlogOffset, int]],
        batch_id: int,
    ) -> None:
        """A batch in which ``table`` was emptied at ``points`` (the last is the cut): the table
        becomes what its changes after the cut leave, in one commit (``replace_rows``). The changelog
        gets every change of the batch and a delete of every row each emptying removed. Folded in
        memory: a TRUNCATE's batch is bounded by the stream's batch size, not by the table."""
        cut = points[-1][0]
        blocks = self._blocks(blobs, staged)
        entry = self.manifest.tables[table]
        if entry.changelog:
            since = entry.changelog_from
            logged = [changes_to_changelog(b, self.arrow[table], since) for b in blocks]
            logged += removed_rows_changelog(self.sink, table, self.arrow[table], self.pks[table], blocks, points,
                                             since)  # fmt: skip
            append_changes(self.sink, table, self.arrow[table], logged, self.app_id, batch_id)
        block = _changes_after(blocks, cut)
        if block is not None:
            upserts, _ = fold_block(block, self.pks[table], table in self.metadata)
            rows = upserts.cast(self.lake[table])
        else:
            rows = self.lake[table].empty_table()
        replace_rows(self.sink, table, rows, self.app_id, batch_id)
        log.info("batch %d: %s emptied at %s; %d rows written after it", batch_id, table, cut, rows.num_rows)

    def _blocks(self, blobs: list[bytes], staged: list[dict[str, Any]]) -> list[pa.Table]:
        """A table's change blocks of this batch, inline and staged, decoded."""
        blocks = [pa.ipc.open_stream(pa.py_buffer(b)).read_all() for b in blobs]
        for f in staged:
            blocks.extend(pa.Table.from_batches([blk]) for blk in read_staged_blocks(f["path"], self.store.storage))
        return blocks

    def _apply_in_memory(self, table: str, blobs: list[bytes], batch_id: int) -> None:
        """One table's changes of a batch: changelog append, fold, one MERGE (each once per batch id)."""
        self.tables.apply(table, blobs, batch_id)

    def _apply_bounded(
        self,
        table: str,
        blobs: list[bytes],
        staged: list[dict[str, Any]],
        nbytes: int,
        batch_id: int,
        progress: BatchProgress | None,
    ) -> dict[str, Any]:
        """Fold ``table``'s changes in hash buckets on local scratch space and apply them as one commit."""
        memory = self.options.apply_memory_mb << 20
        buckets = buckets_for(nbytes, memory)
        pk = self.pks[table]
        log.info("batch %d: %s: %.1f MiB of changes (%d staged files): folding in %d bucket(s) within %d MiB",
                 batch_id, table, nbytes / 2**20, len(staged), buckets, self.options.apply_memory_mb)  # fmt: skip
        prefix = f"mysqlcdc-{self.store.pipeline_id}-b{batch_id}-"
        if self.options.scratch_dir:
            os.makedirs(self.options.scratch_dir, exist_ok=True)
        workdir = tempfile.mkdtemp(prefix=prefix, dir=self.options.scratch_dir)
        fold = BucketedFold(pk, buckets, os.path.join(workdir, "fold"), with_metadata=table in self.metadata)
        throttle = _Throttle(5.0)

        def report(phase: str, details: dict[str, Any]) -> None:
            if progress is not None:
                progress.phase(phase, table=table, **details)
            if throttle.due():
                log.info("batch %d: %s: %s %s", batch_id, table, phase, details)

        try:
            if self.manifest.tables[table].changelog:
                self._log_bounded(table, blobs, staged, batch_id)
            for blob in blobs:
                fold.add(pa.ipc.open_stream(pa.py_buffer(blob)).read_all())
            for f in staged:
                for block in read_staged_blocks(f["path"], self.store.storage):
                    fold.add(block)
                    report("collecting", {"changes_collected": fold.changes})
            result = apply_folded_changes(self.sink, table, fold.buckets(), pk, self.app_id, batch_id,
                                          workdir=os.path.join(workdir, "keys"), memory_bytes=memory,
                                          progress=report)  # fmt: skip
        finally:
            fold.close()
            shutil.rmtree(workdir, ignore_errors=True)
        out = {**result.to_dict(), "buckets": buckets, "change_bytes": nbytes, "changes": fold.changes}
        log.info("batch %d: %s applied in bounded memory: %s", batch_id, table, out)
        return out

    def _log_bounded(self, table: str, blobs: list[bytes], staged: list[dict[str, Any]], batch_id: int) -> None:
        """Stream a large batch's changes of ``table`` into its changelog, block by block, in one commit."""
        schema = self.arrow[table]
        since = self.manifest.tables[table].changelog_from

        def tables() -> Iterator[pa.Table]:
            for blob in blobs:
                yield changes_to_changelog(pa.ipc.open_stream(pa.py_buffer(blob)).read_all(), schema, since)
            for f in staged:
                for block in read_staged_blocks(f["path"], self.store.storage):
                    yield changes_to_changelog(pa.Table.from_batches([block]), schema, since)

        rows = append_changes(self.sink, table, schema, tables(), self.app_id, batch_id)
        log.info("batch %d: %s: %s changelog rows appended", batch_id, table, "no" if rows is None else rows)


def _changes_after(blocks: list[pa.Table], cut: BinlogOffset) -> pa.Table | None:
    """The changes of ``blocks`` after ``cut``, in batch order; None when there are none."""
    later = [changes_after(b, cut.sort_key()) for b in blocks]
    block = pa.concat_tables(later).sort_by("seq") if later else None
    return block if block is not None and block.num_rows else None


def _before_cut_over(row: dict[str, Any], swaps: dict[str, tuple[BinlogOffset, str]]) -> bool:
    """Whether a block row of a table lies before the table's cut-over in this batch."""
    cut = swaps.get(row["tbl"])
    return cut is not None and BinlogOffset(row["file"], int(row["pos"])) < cut[0]


class _Throttle:
    """True at most once every ``seconds``: keeps a long bounded apply's log readable."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._last = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self.seconds:
            self._last = now
            return True
        return False


__all__ = ["BatchApplier"]
