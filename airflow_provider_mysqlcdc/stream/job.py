"""The long-lived binlog stream: Structured Streaming from the ``mysql_binlog`` source into Delta.

This module runs the query: start it from the manifest, block while it runs, stop it at a batch
boundary, pause it for a hand-over and restart it with the new manifest, restart it after
following a schema change (``stream/schema_follow.py``). What a micro-batch does is
``stream/applier.py``: each batch is applied per table as one Delta commit (last change per key
wins, in binlog order) tagged with the Delta transaction identifier ``(app_id, batch_id)``. Spark
writes the batch's offsets to the checkpoint *before* running it and marks it committed *after*; a
crash in between replays the same batch id, which the sink recognises and skips for every table it
already committed — exactly once without a distributed transaction (docs/architecture.md,
"The sink", "Hand-overs").

A SIGTERM (Airflow's on_kill, ``mysqlcdc stop``, Kubernetes) asks the query to stop once the
current batch has finished, so the checkpoint is always at a batch boundary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import MANIFEST, StateStore
from airflow_provider_mysqlcdc.storage import is_local
from airflow_provider_mysqlcdc.stream.applier import BatchApplier
from airflow_provider_mysqlcdc.stream.apply_processes import ApplyProcesses, processes_for
from airflow_provider_mysqlcdc.stream.batch_stop import quiet_routine_stops
from airflow_provider_mysqlcdc.stream.checkpoint_copy import CheckpointCopy
from airflow_provider_mysqlcdc.stream.control import (
    PAUSE_TIMEOUT_SECONDS,
    RELOAD,
    SCHEMA_CHANGE,
    STAGED,
    StreamRunRecorder,
    checkpoint_dir,
    checkpoint_offset,
)
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from airflow_provider_mysqlcdc.stream.schema_follow import StreamSchemaError, follow_schema_change
from airflow_provider_mysqlcdc.stream.staged_blocks import clear_staging

log = logging.getLogger(__name__)


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
    stops the query before applying anything (as a stop, not an error: ``stream/batch_stop.py``),
    the Delta table and manifest follow the ALTER, and the query restarts from its checkpoint (the
    same batch again, decoded with the new schema). A hand-over
    (tables added or re-snapshotted: ``pipeline.finalize_run``) pauses the query and restarts it with
    the new manifest in the same Spark application."""
    stop_event = stop_event or threading.Event()  # one event: signals reach a paused stream too
    policy = (options or StreamOptions()).schema_change_policy
    with _apply_processes(store, options) as processes:
        _run_queries(spark, settings, store, sink, options, recorder, stop_event, policy, processes)


def _apply_processes(store: StateStore, options: StreamOptions | None) -> contextlib.AbstractContextManager[Any]:
    """The processes applying the stream's tables (``stream/apply_processes.py``), for the whole run
    (kept across query restarts: they carry the tables' state); a null context when the driver's
    threads apply them."""
    manifest = store.read_manifest()
    count = processes_for((options or StreamOptions()).apply_processes, len(manifest.tables) if manifest else 0)
    if not count:
        return contextlib.nullcontext(None)
    log.info("stream %s: %d apply processes, each owning a share of the tables", store.pipeline_id, count)
    return ApplyProcesses(count)


def _run_queries(spark: Any, settings: ConnectionSettings, store: StateStore, sink: DeltaSink,
                 options: StreamOptions | None, recorder: StreamRunRecorder | None, stop_event: threading.Event,
                 policy: str, processes: ApplyProcesses | None) -> None:  # fmt: skip
    while True:
        if store.exists(SCHEMA_CHANGE):  # a crash after a batch met a DDL: follow it first
            follow_schema_change(store, sink, settings, policy)
        checkpoint = checkpoint_copy(store, options)
        met_ddl = threading.Event()  # set by a batch that met a DDL to follow (stream/batch_stop.py)
        query = start_stream(spark, settings, store, sink, options, checkpoint, processes, on_ddl=met_ddl.set)
        try:
            why = run_until_stopped(query, stop_event, recorder, met_ddl)
        except RuntimeError:
            _close(checkpoint)
            if not store.exists(SCHEMA_CHANGE):
                raise
        else:
            _close(checkpoint)  # the last commit marker is in the store before a hand-over reads it
            if why == "reload" and recorder is not None and hold_for_handover(recorder, stop_event,
                                                                                lambda: jvm_answers(spark)):
                continue  # the hand-over is done: the same application runs the new manifest
            if why != "schema change":
                return
        try:
            tables = follow_schema_change(store, sink, settings, policy)
        except StreamSchemaError as exc:
            if recorder is not None:
                recorder.write(state="failed", error=str(exc))
            raise
        log.info("schema of %s followed; restarting the stream from its checkpoint", tables)


def jvm_answers(spark: Any) -> bool:
    """Whether the driver JVM still answers a trivial call (a paused stream touches it no other way)."""
    try:
        spark.sparkContext._jvm.java.lang.System.currentTimeMillis()
    except Exception:
        return False
    return True


def checkpoint_copy(store: StateStore, options: StreamOptions | None = None) -> CheckpointCopy | None:
    """A local copy of the stream's checkpoint when the state store is an object store (Spark writes
    its checkpoint through Hadoop, which may have no connector for it: ``stream/checkpoint_copy.py``),
    restored from the store; None for a local state store."""
    if is_local(store.state_root):
        return None
    copy = CheckpointCopy(store, checkpoint_dir(store), (options or StreamOptions()).scratch_dir)
    copy.restore()
    return copy


def _close(checkpoint: CheckpointCopy | None) -> None:
    if checkpoint is not None:
        try:
            checkpoint.push()
        finally:
            checkpoint.close()


def start_stream(
    spark: Any,
    settings: ConnectionSettings,
    store: StateStore,
    sink: DeltaSink,
    options: StreamOptions | None = None,
    checkpoint: CheckpointCopy | None = None,
    processes: ApplyProcesses | None = None,
    on_ddl: Callable[[], None] | None = None,
) -> Any:
    """Start the streaming query from the manifest in the state store (or its checkpoint).

    With an object-store state store the query checkpoints to ``checkpoint`` (made here if not
    given), whose new files every micro-batch copies into the store before it applies anything.
    ``on_ddl``: a batch that meets a DDL to follow calls it and waits to be stopped by the caller
    (``stream/batch_stop.py``); without it, such a batch fails the query."""
    from airflow_provider_mysqlcdc.sinks.delta_small_table import prime_table_state
    from airflow_provider_mysqlcdc.stream.spark_source import register

    opts = options or StreamOptions()
    if checkpoint is None:
        checkpoint = checkpoint_copy(store, opts)
    manifest = store.read_manifest()
    if manifest is None:
        raise FileNotFoundError(
            f"no stream manifest for pipeline {store.pipeline_id} under {store.state_root}: run the snapshot and "
            "the stream operator (which builds the manifest) first"
        )
    sink.routes = manifest.selection.routing  # routed shards write their share of a shared table
    loaded = {}
    for t in manifest.tables:  # another pipeline's table is refused before anything runs
        if not sink.exists(t):
            continue
        dt = loaded[t] = sink.latest(t)  # loaded once here: batches read only new log entries
        sink.check_owner(t, dt)
        if sink.owner is not None and sink.owner_of(t, dt) is None:
            sink.claim(t)  # a table created before owners were recorded
        # a table created before tables declared their statistics columns
        sink.declare_stats_columns(t, manifest.tables[t].merge_key, opened=dt)
    register(spark)
    staging = store.url(STAGED)
    # no batch runs yet: whatever is staged belongs to a batch that will be replayed
    clear_staging(staging, store.storage)
    reader = spark.readStream.format("mysql_binlog").option("manifest", store.url(MANIFEST)).option("staging", staging)
    if not opts.source_env:
        reader = reader.option("source", json.dumps(settings.to_dict()))
    if not opts.storage_env and store.storage.options:
        reader = reader.option("storage", store.storage.to_json())
    for k, v in opts.source_options().items():
        reader = reader.option(k, v)
    if on_ddl is not None:
        quiet_routine_stops()
    applier = BatchApplier(store, sink, manifest, opts, staging, checkpoint, processes, on_ddl)
    if processes is not None:  # each process loads the state of the tables it owns
        units: dict[str, list[str]] = defaultdict(list)
        for t in loaded:
            units[sink.table_uri(t)].append(t)
        primed = processes.prime(units)
    else:
        primed = sum(prime_table_state(sink, t, dt, applier.app_id) for t, dt in loaded.items())
    if primed:
        log.info("stream %s: %d small tables committed directly from their carried state", store.pipeline_id, primed)
    location = checkpoint.local if checkpoint is not None else store.url(checkpoint_dir(store, manifest))
    query = (
        reader.load()
        .writeStream.queryName(f"mysqlcdc-{store.pipeline_id}")
        .foreachBatch(applier)
        .option("checkpointLocation", location)
        .trigger(processingTime=f"{opts.trigger_seconds} seconds")
        .start()
    )
    log.info("stream %s started (checkpoint %s%s)", store.pipeline_id, store.url(checkpoint_dir(store, manifest)),
             f", worked on in {location}" if checkpoint is not None else "")  # fmt: skip
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


def stop_gracefully(
    query: Any, timeout: float = 120.0, beat: Callable[[], None] | None = None, now: threading.Event | None = None
) -> None:
    """Stop once the running micro-batch has finished (or none runs), at most ``timeout`` later.

    A busy stream starts the next batch as soon as one ends, so there may be no idle moment to
    wait for: stopping right after a batch completes interrupts at most the first moments of the
    next one. Either way nothing is lost or applied twice (the offsets of a batch are logged before
    it runs, and its Delta commit carries the batch id). ``beat`` runs while waiting (the run
    record's heartbeat: a busy stream must not look dead meanwhile); ``now`` set ends the wait (a
    batch that met a DDL waits for the stop itself).
    """
    deadline = time.monotonic() + timeout
    running = _last_batch_id(query)
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive", False) or _last_batch_id(query) != running:
            break
        if now is not None and now.is_set():
            break
        if beat is not None:
            beat()
        time.sleep(0.05)
    query.stop()


def _last_batch_id(query: Any) -> int | None:
    prog = query.lastProgress
    return None if not prog else int(prog.get("batchId", -1))


def run_until_stopped(
    query: Any, stop_event: threading.Event | None = None, recorder: StreamRunRecorder | None = None,
    met_ddl: threading.Event | None = None,
) -> str:
    """Block while the query runs; stop it gracefully on SIGTERM/SIGINT, ``stop_event``, a stop
    request or a hand-over request, and at once when a batch sets ``met_ddl`` (it waits for the
    stop: ``stream/batch_stop.py``). Returns ``"reload"`` for a hand-over (the caller holds the
    stream paused, then restarts the query), ``"schema change"`` for a DDL (the caller follows it,
    then restarts the query), else ``"stopped"``.

    With a ``recorder`` the driver heartbeats its run record into the state store and honours
    ``mysqlcdc stop`` / the stop operator's request and hand-overs (:mod:`stream.control`).
    """
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    if recorder is not None:
        recorder.write(state="running", committed_offset=_offset_dict(committed_offset(query)))
        done = recorder.record.reloaded
        pending = recorder.store.read_reload()
        if done and pending is not None and pending.reload_id == done:
            recorder.store.delete(RELOAD)  # the hand-over that restarted this query is complete
    why = "signal"
    while query.isActive and not stop.is_set():
        stop.wait(1.0)
        if met_ddl is not None and met_ddl.is_set():
            break
        if recorder is not None:
            recorder.heartbeat(committed_offset(query))
            if recorder.stop_requested():
                why = "stop request"
                break
            req = recorder.reload_requested()
            if req is not None:
                why = "reload"
                recorder.record.reload_id = req.reload_id
                break
    if met_ddl is not None and met_ddl.is_set():  # a batch waits for this stop; the stream goes on
        why = "schema change"
    try:
        if why == "schema change":
            query.stop()  # Spark takes it for a stop: the waiting batch is not committed, and runs again
        elif query.isActive:
            log.info("stopping stream gracefully (%s)", why)
            if recorder is not None:
                recorder.write(state="stopping")
            beat = None if recorder is None else (lambda: recorder.heartbeat(committed_offset(query)))
            stop_gracefully(query, RELOAD_GRACE_SECONDS if why == "reload" else 120.0, beat, met_ddl)
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
    if why in ("reload", "schema change"):
        return why
    if recorder is not None:
        recorder.write(state="stopped", committed_offset=_offset_dict(committed_offset(query)))
    return "stopped"


def hold_for_handover(
    recorder: StreamRunRecorder, stop_event: threading.Event | None = None, alive: Callable[[], bool] | None = None
) -> bool:
    """Stay paused (query stopped, Spark application up) until the hand-over is ready; True to resume.

    The process that asked for the pause (``pipeline.finalize_run``) reads the committed offset
    recorded here, swaps tables and writes the new manifest, then marks the request ready. A stop
    request, a signal, or a hand-over that never completes (:data:`PAUSE_TIMEOUT_SECONDS`) stops
    the stream instead; the checkpoint is at a batch boundary either way. ``alive`` (the driver JVM
    answers) is asked before each heartbeat: a paused driver touches the JVM no other way, and must
    not heartbeat "paused" for a JVM that is gone (a ConnectionRefusedError instead: the job records
    the failure, naming the JVM).
    """
    store = recorder.store
    reload_id = recorder.record.reload_id
    ckpt = checkpoint_offset(store)
    recorder.write(state="paused", reload_id=reload_id, committed_offset=_offset_dict(ckpt))
    log.info("stream paused for hand-over %s at %s", reload_id, ckpt)
    stop = stop_event or threading.Event()
    deadline = time.monotonic() + PAUSE_TIMEOUT_SECONDS
    while True:
        if stop.is_set() or recorder.stop_requested():
            recorder.write(state="stopped", committed_offset=_offset_dict(ckpt))
            return False
        req = store.read_reload()
        if req is None or req.reload_id != reload_id or req.state == "ready":
            # ready, or withdrawn: either way the current manifest is the one to run
            log.info("hand-over %s done: restarting the query with the current manifest", reload_id)
            recorder.write(state="starting", reloaded=reload_id)
            return True
        if time.monotonic() > deadline:
            recorder.write(state="stopped", error=f"paused for hand-over {reload_id} for {PAUSE_TIMEOUT_SECONDS:.0f}s "
                           "without it completing: the run that asked for it failed; re-run the DAG to restart "
                           "the stream")  # fmt: skip
            return False
        if alive is not None and recorder.heartbeat_due() and not alive():
            raise ConnectionRefusedError(f"the Spark driver JVM stopped answering while the stream was paused for "
                                         f"hand-over {reload_id}")  # fmt: skip
        recorder.heartbeat(ckpt)
        stop.wait(0.2)


def _offset_dict(off: BinlogOffset | None) -> dict[str, Any] | None:
    return None if off is None else off.to_dict()
