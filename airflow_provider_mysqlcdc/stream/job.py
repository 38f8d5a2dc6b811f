"""The long-lived binlog stream: Structured Streaming from the ``mysql_binlog`` source into Delta.

Each micro-batch is applied per table as one Delta MERGE (last change per key wins, in binlog
order), tagged with the Delta transaction identifier ``(app_id, batch_id)``. Spark writes the batch's
offsets to the checkpoint *before* running it and marks it committed *after*; a crash in between
replays the same batch id, which the sink recognises and skips for every table it already
committed — exactly once without a distributed transaction.

A SIGTERM (Airflow's on_kill, ``mysqlcdc stop``, Kubernetes) asks the query to stop once the
current batch has finished, so the checkpoint is always at a batch boundary.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.change_block import decode_blocks, fold_block
from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy, maintain_table
from airflow_provider_mysqlcdc.sinks.delta_rewrite import apply_folded_changes
from airflow_provider_mysqlcdc.spill.bucketed_fold import FOLD_MEMORY_FACTOR, BucketedFold, buckets_for
from airflow_provider_mysqlcdc.state import MANIFEST, StateStore
from airflow_provider_mysqlcdc.stream.batch_progress import BatchProgress
from airflow_provider_mysqlcdc.stream.control import (
    PAUSE_TIMEOUT_SECONDS,
    RELOAD,
    SCHEMA_CHANGE,
    STAGED,
    STATUS,
    StreamRunRecorder,
    checkpoint_dir,
    checkpoint_offset,
)
from airflow_provider_mysqlcdc.stream.staged_blocks import clear_staging, read_staged_blocks, remove_batch

log = logging.getLogger(__name__)



@dataclass
class StreamOptions:
    """How the stream reads and applies; README "Large transactions" documents the memory ones."""

    trigger_seconds: float = 1.0
    max_events_per_trigger: int | None = 200_000  # binlog EVENTS (a rows event holds many rows)
    # Binlog bytes per micro-batch: bounds what a batch brings to the driver (the fold and MERGE run
    # there). Without it, 1,000-row transactions make 200k events ~5M rows: an OOM on a 1g driver.
    # A single transaction above the cap still forms one batch: see max_inline_bytes.
    max_bytes_per_trigger: int | None = 32 * 1024 * 1024
    readers: int | None = None  # parallel binlog decoders per micro-batch; None = Spark's cores
    # Change blocks per micro-batch sent through Spark to the driver (shared by its tasks); the rest
    # is staged in the state store (stream/staged_blocks.py). None = the source's default (32 MiB).
    max_inline_bytes: int | None = None
    # Memory the driver's Python may use to fold and match ONE table's changes of a batch; a batch
    # whose blocks need more is folded in hash buckets spilled to scratch_dir (cdc/bucketed_fold.py)
    # and applied by a bounded copy-on-write rewrite in one commit (sinks/delta_rewrite.py).
    apply_memory_mb: int = 512
    scratch_dir: str | None = None  # local scratch space of the driver; None = the system temp dir
    # Table maintenance between batches (sinks/delta_maintenance.py): compaction, checkpoint, vacuum.
    maintenance: MaintenancePolicy = field(default_factory=MaintenancePolicy)

    def __post_init__(self) -> None:
        if self.apply_memory_mb < 16:
            raise ValueError(f"apply_memory_mb must be at least 16, got {self.apply_memory_mb}")

    def source_options(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.max_events_per_trigger:
            out["max_events_per_trigger"] = str(self.max_events_per_trigger)
        if self.max_bytes_per_trigger:
            out["max_bytes_per_trigger"] = str(self.max_bytes_per_trigger)
        if self.readers:
            out["readers"] = str(self.readers)
        if self.max_inline_bytes is not None:
            out["max_inline_bytes"] = str(self.max_inline_bytes)
        return out


class BatchApplier:
    """``foreachBatch`` body: decode, fold per table, MERGE into Delta idempotently, report status.

    A table's changes of one batch are applied in memory (fold + one delta-rs MERGE) when they are
    small, and in bounded memory (bucketed fold + copy-on-write rewrite, one commit) when a task
    staged them or they would need more than ``apply_memory_mb`` to fold: a transaction of any size
    applies without the driver holding it.
    """

    def __init__(
        self,
        store: StateStore,
        sink: DeltaSink,
        manifest: Manifest,
        options: StreamOptions | None = None,
        staging: str | None = None,
    ):
        self.store = store
        self.sink = sink
        self.manifest = manifest
        self.options = options or StreamOptions()
        self.staging = staging
        self.schemas = manifest.schemas()
        self.arrow = {t: cdc_types.arrow_schema(s) for t, s in self.schemas.items()}
        self.pks = {t: list(e.merge_key) for t, e in manifest.tables.items()}
        self.schema_positions = {t: e.schema_position for t, e in manifest.tables.items() if e.schema_position}
        self.app_id = manifest.app_id(store.pipeline_id)
        self.batches = 0
        # what the status file says between batches; a large batch's progress is written on top of it
        last = store.read_json(STATUS) or {}
        self.last_status: dict[str, Any] = {k: v for k, v in last.items() if k != "current_batch"}
        self._maintained_at = time.monotonic()  # the first round comes one interval after the start

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        with BatchProgress(self.store, self.manifest, batch_id, self.staging, self.last_status) as progress:
            data = batch_df.toArrow() if hasattr(batch_df, "toArrow") else pa.Table.from_pandas(batch_df.toPandas())
            self.apply_arrow(data, batch_id, t0, progress)
        self.maintain_if_due()

    def maintain_if_due(self, force: bool = False) -> dict[str, Any] | None:
        """Compact, checkpoint and vacuum the stream's tables every ``maintenance.interval_seconds``.

        Runs between two batches, so the stream itself never writes a table meanwhile. A failure is
        logged and recorded in the status, never fatal: the next round tries again.
        """
        policy = self.options.maintenance
        now = time.monotonic()
        if not force and (not policy.interval_seconds or now - self._maintained_at < policy.interval_seconds):
            return None
        self._maintained_at = now
        pointer = self.store.read_json("current_plan.json") or {}
        orphans = bool(pointer.get("finalized", True))  # no snapshot staging in flight: orphans may go
        done: dict[str, Any] = {}
        for t in sorted(self.schemas):
            try:
                if self.sink.exists(t):
                    done[t] = maintain_table(self.sink, t, policy, orphans=orphans).to_dict()
            except Exception as exc:  # never fatal: disk use only grows until the next round
                log.warning("maintenance of %s failed (the next round tries again): %s", t, exc)
                done[t] = {"error": str(exc)[:500]}
        summary = {"at": time.time(), "tables": done}
        self.last_status = {**self.last_status, "maintenance": summary}
        self.store.write_json(STATUS, self.last_status)
        return summary

    def apply_arrow(
        self, data: pa.Table, batch_id: int, t0: float | None = None, progress: BatchProgress | None = None
    ) -> dict[str, int]:
        """Apply one micro-batch (``mysql_binlog`` output: change blocks) to the Delta tables.

        Per table the blocks are decoded and folded with Arrow kernels (``cdc/change_block.py``)
        into upserts and delete keys, then applied as one commit tagged ``(app_id, batch_id)``.
        """
        t0 = t0 if t0 is not None else time.monotonic()
        blobs: dict[str, list[bytes]] = defaultdict(list)
        staged: dict[str, list[dict[str, Any]]] = defaultdict(list)
        counts: dict[str, int] = defaultdict(int)
        last_event: BinlogOffset | None = None
        last_commit_ts = 0
        if data.num_rows:
            self._check_ddl(data, batch_id)
            meta = data.select(["tbl", "kind", "rows", "file", "pos", "commit_ts", "info"]).to_pylist()
            invalid = [r for r in meta if r["kind"] == "invalid" and r["tbl"] in self.arrow]
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
        for t in sorted(set(blobs) | set(staged)):
            nbytes = sum(len(b) for b in blobs[t]) + sum(int(f["bytes"]) for f in staged[t])
            if staged[t] or nbytes * FOLD_MEMORY_FACTOR > memory:
                bounded[t] = self._apply_bounded(t, blobs[t], staged[t], nbytes, batch_id, progress)
                continue
            block = decode_blocks(blobs[t])
            if block is None:
                continue
            upserts, delete_keys = fold_block(block, self.pks[t])
            self.sink.apply_changes(t, upserts.cast(self.arrow[t]), delete_keys, self.pks[t], self.app_id, batch_id)
        lag = round(time.time() - last_commit_ts, 3) if last_commit_ts else None
        status = {
            "batch_id": batch_id,
            "rows": sum(counts.values()),
            "rows_per_table": dict(counts),
            "last_event": None if last_event is None else {"file": last_event.file, "pos": last_event.pos},
            "lag_seconds": lag,
            "updated_at": time.time(),
            "seconds": round(time.monotonic() - t0, 3),
        }
        if bounded:
            status["bounded_apply"] = bounded
        if progress is not None and progress.announced:
            snap = progress.snapshot()
            status["large_batch"] = {k: v for k, v in snap.items() if k in ("start", "end", "binlog_bytes")}
        if "maintenance" in self.last_status:
            status["maintenance"] = self.last_status["maintenance"]
        self.store.write_json(STATUS, status)
        self.last_status = status
        if self.staging:  # the batch's staged blocks and progress files are never read again
            done = {f["path"].rsplit("/", 2)[-2] for fs in staged.values() for f in fs}
            if progress is not None and progress.announced and progress.snapshot().get("key"):
                done.add(progress.snapshot()["key"])
            for key in done:
                remove_batch(self.staging, key)
        lag_text = f"lag {lag}s" if lag is not None else "no changes"
        log.info("batch %d: %s rows %s, %s, %.2fs", batch_id, status["rows"], dict(counts), lag_text, status["seconds"])
        self.batches += 1
        return dict(counts)

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
        fold = BucketedFold(pk, buckets, os.path.join(workdir, "fold"))
        throttle = _Throttle(5.0)

        def report(phase: str, details: dict[str, Any]) -> None:
            if progress is not None:
                progress.phase(phase, table=table, **details)
            if throttle.due():
                log.info("batch %d: %s: %s %s", batch_id, table, phase, details)

        try:
            for blob in blobs:
                fold.add(pa.ipc.open_stream(pa.py_buffer(blob)).read_all())
            for f in staged:
                for block in read_staged_blocks(f["path"]):
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

    def _check_ddl(self, data: pa.Table, batch_id: int) -> None:
        """Stop the batch before anything is applied if it holds a DDL the stream has not followed.

        The batch's rows after the DDL were decoded with the old schema (a new column's values
        dropped), so none of the batch may be applied: the job follows the DDL (evolves the Delta
        table, records the new schema in the manifest) and restarts the query, which runs this
        same batch again — now decoded with the new schema, and this DDL marked as followed.
        """
        ddl = data.filter(pc.equal(data.column("kind"), "ddl"))  # rare: most batches have none
        pending = []
        for row in ddl.select(["tbl", "info", "file", "pos"]).to_pylist():
            t = row["tbl"]
            at = BinlogOffset(row["file"], int(row["pos"]))
            done = self.schema_positions.get(t)
            if done is not None and at <= done:
                continue
            info = json.loads(row["info"])
            pending.append({"table": t, "kind": info["kind"], "sql": info["sql"], "offset": at.to_dict()})
        if pending:
            self.store.write_json(SCHEMA_CHANGE, {"batch_id": batch_id, "changes": pending, "at": time.time()})
            what = [f"{c['kind'].upper()} of {c['table']} at {BinlogOffset.from_dict(c['offset'])}" for c in pending]
            raise SchemaChangeReached("; ".join(what))


class _Throttle:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self._last = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self.seconds:
            self._last = now
            return True
        return False


class SchemaChangeReached(RuntimeError):
    """A micro-batch holds a DDL on a captured table that the stream has not followed yet."""


class StreamSchemaError(RuntimeError):
    """A DDL the Delta tables cannot follow; the message names the table and the fix."""


def follow_schema_change(store: StateStore, sink: DeltaSink, settings: ConnectionSettings) -> list[str]:
    """Follow the DDL recorded by :class:`BatchApplier`: evolve the Delta tables, update the manifest.

    ``ALTER TABLE`` that adds columns or widens types is followed (the table's current definition is
    read from the server; older rows read NULL in added columns). Anything else — TRUNCATE, DROP,
    RENAME, CREATE OR REPLACE, a changed primary key, a dropped or narrowed column — raises
    :class:`StreamSchemaError`: nothing at or after the DDL has been applied, and re-snapshotting
    the table (backfill) moves its filters past the DDL.
    """
    from airflow_provider_mysqlcdc.core.table import SourceSchemaError, TableId
    from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
    from airflow_provider_mysqlcdc.sinks.delta import UnsupportedSchemaChange

    rec = store.read_json(SCHEMA_CHANGE)
    if not rec:
        return []
    manifest = store.read_manifest()
    assert manifest is not None, "a schema change was recorded by a stream that had a manifest"
    by_table: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in rec["changes"]:
        by_table[c["table"]].append(c)
    fix = "Re-snapshot {t}: trigger the DAG with resnapshot_tables=['{t}'] (the stream then resumes past this DDL)"
    followed = []
    for t, changes in by_table.items():
        last = max(BinlogOffset.from_dict(c["offset"]) for c in changes)
        for c in changes:
            if c["kind"] != "alter":
                raise StreamSchemaError(
                    f"{c['kind'].upper()} of {t} at {BinlogOffset.from_dict(c['offset'])} ({c['sql'][:200]}): the "
                    f"binlog has no row changes for it, so the Delta table cannot follow. {fix.format(t=t)}. "
                    "The stream stopped before it; nothing after it was applied"
                )
        entry = manifest.tables[t]
        old = entry.schema
        try:
            with settings.connect() as conn:
                new = read_table_schema(conn, TableId.parse(t))
        except SourceSchemaError as exc:
            msg = f"{t} changed at {last} and cannot be read now ({exc}). {fix.format(t=t)}"
            raise StreamSchemaError(msg) from None
        if [c.lower() for c in new.primary_key] != [c.lower() for c in old.primary_key]:
            raise StreamSchemaError(
                f"the primary key of {t} changed at {last} (from {old.primary_key} to {new.primary_key}): rows are "
                f"merged by that key. {fix.format(t=t)}"
            )
        try:
            evo = sink.evolve_schema(t, cdc_types.arrow_schema(new), new.merge_key(entry.chunk_key_columns))
        except UnsupportedSchemaChange as exc:
            raise StreamSchemaError(f"{exc} (DDL at {last}); the stream stopped before it") from None
        old_names = {c.name.lower() for c in old.columns}
        added = [c.name for c in new.columns if c.name.lower() not in old_names]
        entry.follow_ddl(new, added, last)
        followed.append(t)
        log.info("followed the DDL of %s at %s: added %s, widened %s", t, last, list(evo.added), list(evo.widened))
    store.write_manifest(manifest)
    store.delete(SCHEMA_CHANGE)
    return followed


def run_stream(
    spark: Any,
    settings: ConnectionSettings,
    store: StateStore,
    sink: DeltaSink,
    options: StreamOptions | None = None,
    recorder: StreamRunRecorder | None = None,
    stop_event: threading.Event | None = None,
) -> None:
    """Run the stream until stopped, following schema changes: a batch that meets an ALTER TABLE
    fails before applying anything, the Delta table and manifest follow the ALTER, and the query
    restarts from its checkpoint (the same batch again, decoded with the new schema). A hand-over
    (tables added or re-snapshotted: ``pipeline.finalize_run``) pauses the query and restarts it with
    the new manifest in the same Spark application."""
    stop_event = stop_event or threading.Event()  # one event: signals reach a paused stream too
    while True:
        if store.exists(SCHEMA_CHANGE):  # a crash after a batch met a DDL: follow it first
            follow_schema_change(store, sink, settings)
        query = start_stream(spark, settings, store, sink, options)
        try:
            why = run_until_stopped(query, stop_event, recorder)
            if why == "reload" and recorder is not None and hold_for_handover(recorder, stop_event):
                continue  # the hand-over is done: the same application runs the new manifest
            return
        except RuntimeError:
            if not store.exists(SCHEMA_CHANGE):
                raise
        try:
            tables = follow_schema_change(store, sink, settings)
        except StreamSchemaError as exc:
            if recorder is not None:
                recorder.write(state="failed", error=str(exc))
            raise
        log.info("schema of %s followed; restarting the stream from its checkpoint", tables)


def start_stream(
    spark: Any,
    settings: ConnectionSettings,
    store: StateStore,
    sink: DeltaSink,
    options: StreamOptions | None = None,
) -> Any:
    """Start the streaming query from the manifest in the state store (or its checkpoint)."""
    from airflow_provider_mysqlcdc.stream.spark_source import register

    opts = options or StreamOptions()
    manifest = store.read_manifest()
    if manifest is None:
        raise FileNotFoundError(
            f"no stream manifest for pipeline {store.pipeline_id} under {store.state_root}: run the snapshot and "
            "the stream operator (which builds the manifest) first"
        )
    for t in manifest.tables:  # another pipeline's table is refused before anything runs
        sink.check_owner(t)
        if sink.owner is not None and sink.exists(t) and sink.owner_of(t) is None:
            sink.claim(t)  # a table created before owners were recorded
    register(spark)
    staging = store.url(STAGED)
    clear_staging(staging)  # no batch runs yet: whatever is staged belongs to a batch that will be replayed
    reader = (
        spark.readStream.format("mysql_binlog")
        .option("source", json.dumps(settings.to_dict()))
        .option("manifest", store.url(MANIFEST))
        .option("staging", staging)
    )
    for k, v in opts.source_options().items():
        reader = reader.option(k, v)
    applier = BatchApplier(store, sink, manifest, opts, staging)
    query = (
        reader.load()
        .writeStream.queryName(f"mysqlcdc-{store.pipeline_id}")
        .foreachBatch(applier)
        .option("checkpointLocation", store.url(checkpoint_dir(store, manifest)))
        .trigger(processingTime=f"{opts.trigger_seconds} seconds")
        .start()
    )
    log.info("stream %s started (checkpoint %s)", store.pipeline_id, store.url(checkpoint_dir(store, manifest)))
    return query


def committed_offset(query: Any) -> BinlogOffset | None:
    """The end offset of the query's last finished micro-batch (None before the first)."""
    return progress_end_offset(query.lastProgress)


def progress_end_offset(prog: dict[str, Any] | None) -> BinlogOffset | None:
    """The binlog end offset in one of the query's progress reports (None if it has none)."""
    if not prog or not prog.get("sources"):
        return None
    end = prog["sources"][0].get("endOffset")
    if not end:
        return None
    return BinlogOffset.from_dict(json.loads(end) if isinstance(end, str) else end)


def wait_until_caught_up(query: Any, target: BinlogOffset, timeout: float = 300.0) -> None:
    """Block until the stream has applied everything before ``target`` (a server offset)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exc = query.exception()
        if exc is not None:
            raise RuntimeError(f"the stream failed: {exc}")
        off = committed_offset(query)
        if off is not None and off >= target and not query.status.get("isTriggerActive"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the stream did not reach {target} within {timeout:.0f}s (last progress: {query.lastProgress})")


#: How long a hand-over waits for a gap between micro-batches before it interrupts the running one
#: (safe: an interrupted batch is replayed from its logged offsets, its Delta commit skipped by id).
RELOAD_GRACE_SECONDS = 10.0


def stop_gracefully(query: Any, timeout: float = 120.0, beat: Callable[[], None] | None = None) -> None:
    """Stop once the running micro-batch has finished (or none runs), at most ``timeout`` later.

    A busy stream starts the next batch as soon as one ends, so there may be no idle moment to
    wait for: stopping right after a batch completes interrupts at most the first moments of the
    next one. Either way nothing is lost or applied twice (the offsets of a batch are logged before
    it runs, and its Delta commit carries the batch id). ``beat`` runs while waiting (the run
    record's heartbeat: a busy stream must not look dead meanwhile).
    """
    deadline = time.monotonic() + timeout
    running = _last_batch_id(query)
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive", False) or _last_batch_id(query) != running:
            break
        if beat is not None:
            beat()
        time.sleep(0.05)
    query.stop()


def _last_batch_id(query: Any) -> int | None:
    prog = query.lastProgress
    return None if not prog else int(prog.get("batchId", -1))


def run_until_stopped(
    query: Any, stop_event: threading.Event | None = None, recorder: StreamRunRecorder | None = None
) -> str:
    """Block while the query runs; stop it gracefully on SIGTERM/SIGINT, ``stop_event``, a stop
    request or a hand-over request. Returns ``"reload"`` for a hand-over (the caller holds the
    stream paused, then restarts the query), else ``"stopped"``.

    With a ``recorder`` the driver heartbeats its run record into the state store and honours
    ``mysqlcdc stop`` / the stop operator's request and hand-overs (:mod:`stream.control`).
    """
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    if recorder is not None:
        recorder.write(state="running", committed_offset=_offset_dict(committed_offset(query)))
        done = recorder.record.get("reloaded")
        if done and (recorder.store.read_json(RELOAD) or {}).get("reload_id") == done:
            recorder.store.delete(RELOAD)  # the hand-over that restarted this query is complete
    why = "signal"
    while query.isActive and not stop.is_set():
        stop.wait(1.0)
        if recorder is not None:
            recorder.heartbeat(committed_offset(query))
            if recorder.stop_requested():
                why = "stop request"
                break
            req = recorder.reload_requested()
            if req is not None:
                why = "reload"
                recorder.record["reload_id"] = req["reload_id"]
                break
    try:
        if query.isActive:
            log.info("stopping stream gracefully (%s)", why)
            if recorder is not None:
                recorder.write(state="stopping")
            beat = None if recorder is None else (lambda: recorder.heartbeat(committed_offset(query)))
            stop_gracefully(query, RELOAD_GRACE_SECONDS if why == "reload" else 120.0, beat)
        exc = query.exception()
        if exc is not None:
            raise RuntimeError(f"the stream failed: {exc}")
    except Exception as exc:
        if recorder is not None:
            if recorder.store.exists(SCHEMA_CHANGE):  # run_stream follows it and restarts: still alive
                recorder.write(state="running", committed_offset=_offset_dict(committed_offset(query)))
            else:
                recorder.write(state="failed", error=str(exc), committed_offset=_offset_dict(committed_offset(query)))
        raise
    if why == "reload":
        return "reload"
    if recorder is not None:
        recorder.write(state="stopped", committed_offset=_offset_dict(committed_offset(query)))
    return "stopped"


def hold_for_handover(recorder: StreamRunRecorder, stop_event: threading.Event | None = None) -> bool:
    """Stay paused (query stopped, Spark application up) until the hand-over is ready; True to resume.

    The process that asked for the pause (``pipeline.finalize_run``) reads the committed offset
    recorded here, swaps tables and writes the new manifest, then marks the request ready. A stop
    request, a signal, or a hand-over that never completes (:data:`PAUSE_TIMEOUT_SECONDS`) stops
    the stream instead; the checkpoint is at a batch boundary either way.
    """
    store = recorder.store
    reload_id = recorder.record.get("reload_id")
    ckpt = checkpoint_offset(store)
    recorder.write(state="paused", reload_id=reload_id, committed_offset=_offset_dict(ckpt))
    log.info("stream paused for hand-over %s at %s", reload_id, ckpt)
    stop = stop_event or threading.Event()
    deadline = time.monotonic() + PAUSE_TIMEOUT_SECONDS
    while True:
        if stop.is_set() or recorder.stop_requested():
            recorder.write(state="stopped", committed_offset=_offset_dict(ckpt))
            return False
        req = store.read_json(RELOAD) or {}
        if req.get("reload_id") != reload_id or req.get("state") == "ready":
            # ready, or withdrawn: either way the current manifest is the one to run
            log.info("hand-over %s done: restarting the query with the current manifest", reload_id)
            recorder.write(state="starting", reloaded=reload_id)
            return True
        if time.monotonic() > deadline:
            recorder.write(state="stopped", error=f"paused for hand-over {reload_id} for {PAUSE_TIMEOUT_SECONDS:.0f}s "
                           "without it completing: the run that asked for it failed; re-run the DAG to restart "
                           "the stream")  # fmt: skip
            return False
        recorder.heartbeat(ckpt)
        stop.wait(0.2)


def _offset_dict(off: BinlogOffset | None) -> dict[str, Any] | None:
    return None if off is None else off.to_dict()
