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
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.cdc import types as cdc_types
from airflow_provider_mysqlcdc.cdc.batch import fold_changes, keys_to_arrow
from airflow_provider_mysqlcdc.cdc.offset import BinlogOffset
from airflow_provider_mysqlcdc.cdc.row_codec import decode_row
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.source.connection import ConnectionSettings
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.manifest import table_schemas_from_manifest

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATUS = "stream/status.json"
CHECKPOINT = "checkpoint"


@dataclass
class StreamOptions:
    trigger_seconds: float = 1.0
    max_events_per_trigger: int | None = 200_000  # binlog EVENTS (a rows event holds many rows)
    # Binlog bytes per micro-batch: bounds what a batch brings to the driver (the fold and MERGE run
    # there). Without it, 1,000-row transactions make 200k events ~5M rows: an OOM on a 1g driver.
    max_bytes_per_trigger: int | None = 32 * 1024 * 1024
    readers: int | None = None  # parallel binlog decoders per micro-batch; None = Spark's cores

    def source_options(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.max_events_per_trigger:
            out["max_events_per_trigger"] = str(self.max_events_per_trigger)
        if self.max_bytes_per_trigger:
            out["max_bytes_per_trigger"] = str(self.max_bytes_per_trigger)
        if self.readers:
            out["readers"] = str(self.readers)
        return out


def app_id(pipeline_id: str) -> str:
    return f"mysqlcdc-stream-{pipeline_id}"


class BatchApplier:
    """``foreachBatch`` body: decode, fold per table, MERGE into Delta idempotently, report status."""

    def __init__(self, store: StateStore, sink: DeltaSink, manifest: dict[str, Any]):
        self.store = store
        self.sink = sink
        self.schemas = table_schemas_from_manifest(manifest)
        self.arrow = {t: cdc_types.arrow_schema(s) for t, s in self.schemas.items()}
        self.pks = {t: list(s.primary_key) for t, s in self.schemas.items()}
        self.app_id = app_id(store.pipeline_id)
        self.batches = 0

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        data = batch_df.toArrow() if hasattr(batch_df, "toArrow") else pa.Table.from_pandas(batch_df.toPandas())
        self.apply_arrow(data, batch_id, t0)

    def apply_arrow(self, data: pa.Table, batch_id: int, t0: float | None = None) -> dict[str, int]:
        t0 = t0 if t0 is not None else time.monotonic()
        per_table: dict[str, list[tuple[str, dict | None, dict | None]]] = defaultdict(list)
        last_pos: tuple[int, int, str] | None = None
        last_commit_ts = 0
        if data.num_rows:
            data = data.sort_by([("file_num", "ascending"), ("event_pos", "ascending"), ("row_index", "ascending")])
            names = ("op", "tbl", "before", "after", "file", "pos", "file_num", "commit_ts")
            cols = {n: data.column(n).to_pylist() for n in names}
            for i in range(data.num_rows):
                t = cols["tbl"][i]
                schema = self.arrow.get(t)
                if schema is None:
                    continue
                before = decode_row(cols["before"][i], schema) if cols["before"][i] is not None else None
                after = decode_row(cols["after"][i], schema) if cols["after"][i] is not None else None
                op = cols["op"][i]
                if op == "u" and before is None:  # the handoff filter dropped the delete-half: an upsert
                    op = "c"
                per_table[t].append((op, before, after))
                last_pos = (cols["file_num"][i], cols["pos"][i], cols["file"][i])
                last_commit_ts = max(last_commit_ts, int(cols["commit_ts"][i] or 0))
        counts: dict[str, int] = {}
        for t, changes in per_table.items():
            upserts, delete_keys = fold_changes(changes, self.pks[t])
            up = cdc_types.rows_to_arrow(upserts, self.schemas[t]) if upserts else self.arrow[t].empty_table()
            dels = keys_to_arrow(delete_keys, self.pks[t], self.arrow[t])
            self.sink.apply_changes(t, up, dels, self.pks[t], self.app_id, batch_id)
            counts[t] = len(changes)
        lag = round(time.time() - last_commit_ts, 3) if last_commit_ts else None
        status = {
            "batch_id": batch_id,
            "rows": sum(counts.values()),
            "rows_per_table": counts,
            "last_event": None if last_pos is None else {"file": last_pos[2], "pos": last_pos[1]},
            "lag_seconds": lag,
            "updated_at": time.time(),
            "seconds": round(time.monotonic() - t0, 3),
        }
        self.store.write_json(STATUS, status)
        log.info("batch %d: %s rows %s, lag %ss, %.2fs", batch_id, status["rows"], counts, lag, status["seconds"])
        self.batches += 1
        return counts


def start_stream(
    spark: Any,
    settings: ConnectionSettings,
    store: StateStore,
    sink: DeltaSink,
    options: StreamOptions | None = None,
) -> Any:
    """Start the streaming query from the manifest in the state store (or its checkpoint)."""
    from airflow_provider_mysqlcdc.stream.source import register

    opts = options or StreamOptions()
    manifest = store.read_json(MANIFEST)
    if manifest is None:
        raise FileNotFoundError(
            f"no stream manifest for pipeline {store.pipeline_id} under {store.state_root}: run the snapshot and "
            "the stream operator (which builds the manifest) first"
        )
    register(spark)
    reader = (
        spark.readStream.format("mysql_binlog")
        .option("source", json.dumps(settings.to_dict()))
        .option("manifest", store.url(MANIFEST))
    )
    for k, v in opts.source_options().items():
        reader = reader.option(k, v)
    applier = BatchApplier(store, sink, manifest)
    query = (
        reader.load()
        .writeStream.queryName(f"mysqlcdc-{store.pipeline_id}")
        .foreachBatch(applier)
        .option("checkpointLocation", store.url(CHECKPOINT))
        .trigger(processingTime=f"{opts.trigger_seconds} seconds")
        .start()
    )
    log.info("stream %s started (checkpoint %s)", store.pipeline_id, store.url(CHECKPOINT))
    return query


def committed_offset(query: Any) -> BinlogOffset | None:
    """The end offset of the query's last finished micro-batch (None before the first)."""
    prog = query.lastProgress
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


def stop_gracefully(query: Any, timeout: float = 120.0) -> None:
    """Stop once no batch is running, so the checkpoint sits at a batch boundary."""
    deadline = time.monotonic() + timeout
    while query.isActive and time.monotonic() < deadline:
        st = query.status
        if not st.get("isTriggerActive", False):
            break
        time.sleep(0.1)
    query.stop()


def run_until_stopped(query: Any, stop_event: threading.Event | None = None) -> None:
    """Block while the query runs; SIGTERM/SIGINT (or ``stop_event``) stop it gracefully."""
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while query.isActive and not stop.is_set():
        stop.wait(0.5)
    if query.isActive:
        log.info("stopping stream gracefully")
        stop_gracefully(query)
    exc = query.exception()
    if exc is not None:
        raise RuntimeError(f"the stream failed: {exc}")
