"""Streaming benchmark: binlog -> Delta throughput against a bare binlog reader, and end-to-end lag.

    .venv/bin/python bench/stream.py [--events 300000] [--repeats 2] [--lag-seconds 30] [--lag-rate 500]
        [--lag-rate-high 5000] [--lag-trigger S] [--only-lag]

Creates its own private MariaDB and a table shaped like a typical fact table (BIGINT PK, INT,
VARCHAR(16), DECIMAL(12,2), DATETIME(6), VARCHAR(200) of ~100 chars, TINYINT), snapshots it into a
Delta sink (plan_snapshot + run_snapshot_group per group) and builds the stream manifest. Then, in
one run and one Spark session (local[2], ``spark.driver.memory`` from ``--driver-memory``, 4g by
default: at Spark's default 1g the single-reader run dies of a Java heap OOM, see RESULTS.md):

* warm-up: an untimed stream over ``--warmup-events`` changes (100,000), so that every measured
  stream finds Spark's Python workers started and the JVM's code compiled (the first stream of a
  session pays that; with a 2-transaction warm-up the first measured stream ran at half the speed
  of the later ones);
* load: records the binlog offset, changes ``--events`` rows as UPDATEs of ``--tx-rows`` rows per
  transaction, records the end offset;
* bare_reader: one python-mysql-replication loop (``BinLogStreamReader`` directly, file/pos dump,
  ``freeze_schema=True`` like the product), touching every value of both images of every row, over
  the same range -> ``bare_reader_rows_per_s``;
* breakdown (skip with ``--no-breakdown``): the same range through the product's layers in this
  thread, as CPU seconds: ``BinlogRangeReader`` with the type converter; the source's task body
  (``stream/partition_read.py``: + handoff filter, change blocks); the driver's
  ``BatchApplier.apply_arrow`` split into its steps (decode blocks, fold), and the Delta MERGE;
* stream: ``start_stream`` from the start offset (manifest start and every chunk's HW = the start
  offset, so every change passes the handoff filter) with ``readers=2``, then ``readers=1``, each
  on its own pipeline id, checkpoint and copy of the Delta table, until the query's endOffset
  reaches the end offset: rows/s from the first micro-batch's trigger start to the end of the
  batch that reached it (``stream_rows_per_s``, ``single_reader_rows_per_s``; the query's start-up
  is reported apart), ratios against the bare reader. The machine is shared: bare / readers=2 /
  readers=1 run ``--repeats`` times, interleaved; the headline ``ratio_of_medians_vs_bare_reader``
  is the median stream rate over the median bare rate (the best of each is reported beside it as
  ``ratio_vs_bare_reader``), and every run carries the CPU our process tree used and the busy cores
  that were not ours (``foreign_cores``);
* lag: a stream (readers=2, trigger ``--lag-trigger``: the product's default unless given) from
  the current offset; once it has run a first trigger and applied one warm-up change, a writer
  doing ``--lag-rate`` single-row UPDATE transactions/s on random distinct keys for
  ``--lag-seconds``; then the same at ``--lag-rate-high`` rows/s (5,000: ten-row transactions,
  ``--lag-high-tx-rows``) -> ``lag_p99_s_5k``; after each, sink == source is checked; each update
  writes a unique value into ``customer`` and records when its commit returned; a poller reads the
  Delta log every 0.05 s (writer and poller each in a process of its own, as a source application
  and a lake reader are: as threads they held the stream driver's GIL) and records when each table
  version first became visible (the time its read of the log returned); afterwards each version is
  scanned for the values it made visible. ``lag = visible - committed`` per change
  (``lag_p50_s``, ``lag_p99_s``; the poll interval adds 0-0.05 s). Also reported: the same against
  the Delta commit timestamps (``lag_commit_*``) and the stream's own per-batch status
  ``lag_seconds`` (``lag_status_*``; whole-second binlog timestamps).

Ends with one JSON line on stdout (the figures); progress goes to stderr. Timing wrappers around
``BatchApplier.apply_arrow`` and ``DeltaSink.apply_changes`` are installed in this process only to
split each micro-batch's time into Spark (``toArrow``: planning, tasks, Arrow transfer), Python
apply and MERGE; they do not change what runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any
from urllib.parse import unquote

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql import binlog_values
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.deletion_vector import vector_location
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.spark_session import build_spark_session
from airflow_provider_mysqlcdc.state import MANIFEST, StateStore
from airflow_provider_mysqlcdc.stream.applier import BatchApplier
from airflow_provider_mysqlcdc.stream.control import STATUS
from airflow_provider_mysqlcdc.stream.job import (
    StreamOptions,
    progress_end_offset,
    start_stream,
    stop_gracefully,
)
from bench.huge_tx import huge_tx_scenario
from tests.support.bench_data import load_orders as load
from tests.support.lag_writers import ProcessPoller, ProcessWriter, update_keys
from tests.support.manifests import manifest_from
from tests.support.mariadb import MariaDBServer

log = logging.getLogger("bench.stream")

TABLE = "bench.orders"
SEQ_BASE = 100_000_000  # lag writer's customer values: above anything the load or the updates write
#: ``--lag-rewrite-below-mb``: the lag streams' ``StreamOptions.rewrite_below_mb``.
LAG_REWRITE_BELOW_MB = StreamOptions().rewrite_below_mb
POLL_SECONDS = 0.05  # 0.2 until Nov 26: it added up to 0.2 s to every measured lag


class CpuMeter:
    """CPU used by this process tree (Spark JVM, its Python workers, MariaDB) and by everything else.

    The machine is shared: ``foreign_cores`` is the machine's busy time that is not ours, per wall
    second, so a figure can be judged against the load it ran under."""

    def __init__(self) -> None:
        self.me = psutil.Process()

    def _category(self, p: psutil.Process) -> str:
        if p.pid == self.me.pid:
            return "driver_python"
        name = p.name()
        if name == "java":
            return "jvm"
        if name.startswith("mariadb"):
            return "mariadb"
        return "python_workers"

    def by_category(self) -> dict[str, float]:
        """CPU seconds so far per kind of process; a reaped child counts for its parent's children."""
        out: dict[str, float] = defaultdict(float)
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                cat = self._category(p)
            except psutil.Error:
                continue
            out[cat] += t.user + t.system
            # the JVM reaps Spark's Python daemon/planner processes; this process reaps probes
            reaped = "python_workers" if cat == "jvm" else ("driver_subprocesses" if cat == "driver_python" else cat)
            out[reaped] += t.children_user + t.children_system
        return dict(out)

    def _ours(self) -> float:
        return sum(self.by_category().values())

    @staticmethod
    def _busy() -> float:
        c = psutil.cpu_times()
        return c.user + c.nice + c.system + c.irq + c.softirq + getattr(c, "steal", 0.0)

    def start(self) -> tuple[float, float, float]:
        return time.monotonic(), self._ours(), self._busy()

    def stop(self, mark: tuple[float, float, float]) -> dict[str, float]:
        wall = time.monotonic() - mark[0]
        ours = self._ours() - mark[1]
        busy = self._busy() - mark[2]
        return {
            "cpu_seconds": round(ours, 2),
            "our_cores": round(ours / wall, 2),
            "foreign_cores": round(max(0.0, busy - ours) / wall, 2),
        }


# ----------------------------------------------------------------------------- source data
def bulk_updates(server: MariaDBServer, rows: int, events: int, tx_rows: int) -> int:
    """``events`` row changes as UPDATE ... WHERE id BETWEEN a AND b, one transaction per statement."""
    conn = server.root_connection("bench")
    done = 0
    try:
        with conn.cursor() as cur:
            while done < events:
                n = min(tx_rows, events - done)
                lo = done % rows + 1
                hi = min(rows, lo + n - 1)
                cur.execute(
                    "UPDATE orders SET customer = customer + 1, amount = amount + 0.01, flag = (flag + 1) %% 3, "
                    "created = created + INTERVAL 1 SECOND WHERE id BETWEEN %s AND %s",
                    (lo, hi),
                )
                done += cur.rowcount
    finally:
        conn.close()
    return done


def offset_now(settings: ConnectionSettings) -> BinlogOffset:
    with settings.connect() as conn:
        off = current_offset(conn)
    return BinlogOffset(off.file, off.pos)


# ----------------------------------------------------------------------------- bare reader
def bare_reader(settings: ConnectionSettings, start: BinlogOffset, server_id: int) -> tuple[int, float, float]:
    """python-mysql-replication alone, single-threaded, to the end of the binlog (== the end offset).

    Returns (rows, seconds, cpu seconds of this thread); every value of both images is touched."""
    t0 = time.perf_counter()
    c0 = time.thread_time()
    stream = BinLogStreamReader(
        connection_settings=settings.replication_settings(),
        server_id=server_id,
        is_mariadb=False,
        resume_stream=True,
        log_file=start.file,
        log_pos=start.pos,
        blocking=False,
        only_events=[UpdateRowsEvent, WriteRowsEvent, DeleteRowsEvent],
        freeze_schema=True,
        enable_logging=False,
    )
    rows = 0
    touched = 0
    try:
        for ev in stream:
            for r in ev.rows:
                if "after_values" in r:
                    touched += sum(len(str(v)) for v in r["before_values"].values())
                    touched += sum(len(str(v)) for v in r["after_values"].values())
                else:
                    touched += sum(len(str(v)) for v in r["values"].values())
                rows += 1
    finally:
        stream.close()
    assert touched > 0
    return rows, time.perf_counter() - t0, time.thread_time() - c0


# ----------------------------------------------------------------------------- manifests, copies
def pipeline(work: str, name: str, manifest: Manifest, lake_from: str | None) -> tuple[StateStore, DeltaSink]:
    store = StateStore(f"{work}/state", name)
    store.write_manifest(manifest)
    lake = f"{work}/lake-{name}"
    if lake_from is not None:
        shutil.copytree(lake_from, lake)
    return store, DeltaSink(lake)


# ----------------------------------------------------------------------------- instrumentation
class Timings:
    """Per micro-batch: Spark time (toArrow), Python apply time, MERGE time, status lag.

    Installed as wrappers around ``BatchApplier.apply_arrow`` and ``DeltaSink.apply_changes`` in
    this process (the foreachBatch body runs in the driver's Python, i.e. here)."""

    def __init__(self, meter: CpuMeter) -> None:
        self.batches: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.meter = meter
        self._merge = threading.local()
        orig_apply = BatchApplier.apply_arrow
        orig_changes = DeltaSink.apply_changes
        timings = self

        @functools.wraps(orig_apply)
        def apply_arrow(self_: Any, data: pa.Table, batch_id: int, t0: float | None = None, *rest: Any) -> Any:
            entered = time.monotonic()
            cpu_in = timings.meter.start()
            timings._merge.seconds = 0.0
            try:
                return orig_apply(self_, data, batch_id, t0, *rest)
            finally:
                done = time.monotonic()
                cpu_out = timings.meter.start()
                status = self_.store.read_json(STATUS) or {}
                with timings.lock:
                    timings.batches.append({
                        "pipeline": self_.store.pipeline_id,
                        "batch_id": batch_id,
                        "rows": sum(data.column("rows").to_pylist()) if data.num_rows else 0,
                        "spark_s": (entered - t0) if t0 is not None else None,
                        "apply_s": done - entered,
                        "merge_s": getattr(timings._merge, "seconds", 0.0),
                        "status_lag_s": status.get("lag_seconds") if status.get("batch_id") == batch_id else None,
                        "end_wall": time.time(),
                        "cpu_in": cpu_in,
                        "cpu_out": cpu_out,
                    })

        @functools.wraps(orig_changes)
        def apply_changes(self_: Any, *args: Any, **kw: Any) -> Any:
            t = time.monotonic()
            try:
                return orig_changes(self_, *args, **kw)
            finally:
                timings._merge.seconds = getattr(timings._merge, "seconds", 0.0) + time.monotonic() - t

        BatchApplier.apply_arrow = apply_arrow  # type: ignore[method-assign]
        DeltaSink.apply_changes = apply_changes  # type: ignore[method-assign]

    def of(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [b for b in self.batches if b["pipeline"] == name and b["rows"]]


def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def wait_caught_up(query: Any, target: BinlogOffset, timeout: float) -> dict[str, Any]:
    """Poll until a finished batch's endOffset >= target; returns that batch's progress."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exc = query.exception()
        if exc is not None:
            raise RuntimeError(f"the stream failed: {exc}")
        for prog in query.recentProgress:
            off = progress_end_offset(prog)
            if off is not None and off >= target:
                return prog
        time.sleep(0.1)
    raise RuntimeError(f"the stream did not reach {target} in {timeout}s; last progress {query.lastProgress}")


# ----------------------------------------------------------------------------- throughput run
def _phase(wall: float, cpu: float, busy: float) -> dict[str, Any]:
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "our_cores": round(cpu / wall, 2) if wall else None,
        "foreign_cores": round(max(0.0, busy - cpu) / wall, 2) if wall else None,
    }


def throughput_run(
    spark: Any, settings: ConnectionSettings, work: str, name: str, manifest: Manifest, lake_from: str,
    target: BinlogOffset, readers: int, timings: Timings, expected_rows: int, max_events: int | None,
) -> dict[str, Any]:
    store, sink = pipeline(work, name, manifest, lake_from)
    t_call = time.time()
    cpu_mark = timings.meter.start()
    cats0 = timings.meter.by_category()
    opts = StreamOptions(trigger_seconds=0.5, readers=readers, max_events_per_trigger=max_events)
    query = start_stream(spark, settings, store, sink, opts)
    t_started = time.time()
    try:
        last = wait_caught_up(query, target, timeout=300)
        progress = [p for p in query.recentProgress if progress_end_offset(p) is not None]
    finally:
        stop_gracefully(query)
    cats1 = timings.meter.by_category()
    data_batches = [
        p for p in progress
        if p["sources"][0].get("startOffset") != p["sources"][0].get("endOffset")
        and int(p["batchId"]) <= int(last["batchId"])
    ]
    first_start = min(_epoch(p["timestamp"]) for p in data_batches)
    last_end = _epoch(last["timestamp"]) + last["durationMs"]["triggerExecution"] / 1000
    batches = timings.of(name)
    rows = sum(b["rows"] for b in batches)
    secs = last_end - first_start
    # CPU: Spark side (from the query's start, or the previous apply's end, to the next apply) vs apply
    spark_cpu = apply_cpu = spark_busy = apply_busy = spark_wall = apply_wall = 0.0
    prev = cpu_mark
    for b in batches:
        spark_cpu += b["cpu_in"][1] - prev[1]
        spark_busy += b["cpu_in"][2] - prev[2]
        spark_wall += b["cpu_in"][0] - prev[0]
        apply_cpu += b["cpu_out"][1] - b["cpu_in"][1]
        apply_busy += b["cpu_out"][2] - b["cpu_in"][2]
        apply_wall += b["cpu_out"][0] - b["cpu_in"][0]
        prev = b["cpu_out"]
    out = {
        "readers": readers,
        "rows": rows,
        "batches": len(batches),
        "seconds": round(secs, 3),
        "startup_seconds": round(first_start - t_call, 3),
        "start_stream_call_seconds": round(t_started - t_call, 3),
        "rows_per_s": round(rows / secs),
        "rows_per_s_incl_startup": round(rows / (last_end - t_call)),
        "spark_seconds": round(sum(b["spark_s"] or 0 for b in batches), 3),
        "python_apply_seconds": round(sum(b["apply_s"] - b["merge_s"] for b in batches), 3),
        "merge_seconds": round(sum(b["merge_s"] for b in batches), 3),
        "trigger_ms": {k: sum(int(p["durationMs"].get(k, 0)) for p in data_batches)
                       for k in ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets")},
        # incl. start-up: CPU of our process tree, and the machine's busy cores that were not ours
        "cpu": timings.meter.stop(cpu_mark),
        "spark_phase": _phase(spark_wall, spark_cpu, spark_busy),
        "apply_phase": _phase(apply_wall, apply_cpu, apply_busy),
        "rows_per_cpu_s": round(rows / max(1e-9, spark_cpu + apply_cpu)),
        "cpu_by_process": {k: round(cats1.get(k, 0.0) - cats0.get(k, 0.0), 2) for k in sorted(cats1)},
    }
    if rows != expected_rows:
        log.warning("%s: the stream applied %d rows, expected %d", name, rows, expected_rows)
    log.info("%s: %s", name, out)
    return out


def check_sink(server: MariaDBServer, sink: DeltaSink) -> bool:
    """Cheap equality check: row count and sum(customer), amount and flag in source and sink (the
    sink read by delta-rs' engine, which applies deletion vectors)."""
    src = server.query("SELECT COUNT(*), SUM(customer), SUM(amount), SUM(flag) FROM bench.orders")[0]
    sql = "SELECT count(*) AS n, sum(customer) AS c, sum(amount) AS a, sum(flag) AS f FROM t"
    got = pa.table(QueryBuilder().register("t", sink.open(TABLE)).execute(sql).read_all())
    dst = tuple(got.column(c)[0].as_py() for c in ("n", "c", "a", "f"))
    ok = (int(src[0]), int(src[1]), src[2], int(src[3])) == (int(dst[0]), int(dst[1]), dst[2], int(dst[3]))
    if not ok:
        log.warning("sink differs from source: source %s, sink %s", src, dst)
    return ok


# ----------------------------------------------------------------------------- breakdown
def breakdown(
    settings: ConnectionSettings, work: str, manifest: Manifest, lake_from: str,
    start: BinlogOffset, end: BinlogOffset, timings: Timings, bare_cpu: float,
) -> dict[str, Any]:
    """The stream's layers over the whole range, in this thread: CPU seconds (``time.thread_time``)
    per layer, so the figures do not depend on what else runs on the machine."""
    from pyspark.sql.types import _parse_datatype_string

    from airflow_provider_mysqlcdc.core.change_block import decode_blocks, fold_block
    from airflow_provider_mysqlcdc.stream.partition_read import SCHEMA, read_partition
    from airflow_provider_mysqlcdc.stream.spark_source import BinlogPartition, MySqlBinlogStreamReader

    schemas = manifest.schemas()
    conv = {t: binlog_values.binlog_row_converter(s) for t, s in schemas.items()}
    cpu: dict[str, float] = {"bare_reader": bare_cpu}

    # 1. BinlogRangeReader + canonical conversion (what every task runs first)
    c0 = time.thread_time()
    n = 0
    sample: list[Any] = []
    with BinlogRangeReader(settings, start, end, [TABLE], 7102, convert=lambda t, v, ns: conv[t](v, ns)) as rr:
        for ch in rr:
            n += 1
            if len(sample) < 50_000:
                sample.append(ch)
    cpu["range_reader"] = time.thread_time() - c0
    # 1b. the same with the fast rows decoder (what the tasks use): full images, then key-only before
    for label, keys in (("range_reader_fast", None), ("range_reader_fast_key_before", {TABLE: ["id"]})):
        c0 = time.thread_time()
        with BinlogRangeReader(settings, start, end, [TABLE], 7104, schemas=schemas, key_columns=keys) as rr:
            for _ in rr:
                pass
        cpu[label] = time.thread_time() - c0
    del sample

    # 2. the task body: + handoff filter, change blocks (typed Arrow, IPC)
    store, sink = pipeline(work, "breakdown", manifest, lake_from)
    reader = MySqlBinlogStreamReader(_parse_datatype_string(SCHEMA), {
        "source": json.dumps(settings.to_dict()), "manifest": store.url(MANIFEST),
    }, 1)
    part = BinlogPartition(0, start.to_dict(), end.to_dict(), 7103)
    c0 = time.thread_time()
    data = pa.Table.from_batches(list(read_partition(reader, part)))
    cpu["task_body"] = time.thread_time() - c0

    # 3. the driver's apply, step by step (the same calls BatchApplier.apply_arrow makes)
    pks = {t: list(s.primary_key) for t, s in schemas.items()}
    c0 = time.thread_time()
    blobs = defaultdict(list)
    for tbl, kind, blob in zip(data.column("tbl").to_pylist(), data.column("kind").to_pylist(),
                               data.column("block").to_pylist(), strict=True):  # fmt: skip
        if kind == "rows":
            blobs[tbl].append(blob)
    blocks = {t: decode_blocks(b) for t, b in blobs.items()}
    cpu["apply_decode_blocks"] = time.thread_time() - c0
    c0 = time.thread_time()
    folded = {t: fold_block(b, pks[t]) for t, b in blocks.items() if b is not None}
    cpu["apply_fold"] = time.thread_time() - c0
    del blobs, blocks, folded

    # 4. the real apply_arrow (with the MERGE) on a fresh copy of the sink
    applier = BatchApplier(store, sink, manifest)
    c0 = time.thread_time()
    t0 = time.monotonic()
    applier.apply_arrow(data, 0, t0)
    cpu["apply_arrow_total"] = time.thread_time() - c0
    b = timings.of("breakdown")[-1]
    out: dict[str, Any] = {
        "rows": n,
        "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},
        "rows_per_cpu_s": {k: round(n / v) for k, v in cpu.items() if v > 0 and not k.startswith("apply_")},
        "apply_arrow_wall_s": round(b["apply_s"], 2),
        "merge_wall_s": round(b["merge_s"], 2),
        "driver_apply_rows_per_s": round(b["rows"] / b["apply_s"]),
    }
    log.info("breakdown: %s", out)
    return out


# ----------------------------------------------------------------------------- lag
def rewritten_per_version(uri: str, after: int, upto: int) -> list[tuple[int, int]]:
    """(bytes, rows) each batch's table version in ``(after, upto]`` wrote: its new data files (a
    copy-on-write MERGE rewrites every file it touches) and its deletion vector files. A file added
    again with a new deletion vector is not rewritten; compactions (no data change) are left out."""
    out = []
    for v in range(after + 1, upto + 1):
        nbytes = nrows = 0
        vectors: set[str] = set()
        with open(os.path.join(uri, "_delta_log", f"{v:020d}.json")) as f:
            actions = [json.loads(line) for line in f]
        removed = {a["remove"]["path"] for a in actions if a.get("remove")}
        for a in actions:
            add = a.get("add")
            if not add or not add.get("dataChange", True):
                continue
            dv = add.get("deletionVector")
            if dv and dv.get("storageType") == "u":
                vectors.add(vector_location(dv))
            if add["path"] in removed and dv:
                continue  # the same file, with a new deletion vector
            nbytes += int(add.get("size") or 0)
            nrows += int(json.loads(add.get("stats") or "{}").get("numRecords") or 0)
        nbytes += sum(os.path.getsize(os.path.join(uri, name)) for name in vectors
                      if os.path.exists(os.path.join(uri, name)))  # fmt: skip
        if nbytes or nrows:
            out.append((nbytes, nrows))
    return out


def values_added(uri: str, version: int, column: str, at_least: int) -> list[int]:
    """Values of ``column`` (at least ``at_least``) in the data files ``version`` added with a data change."""
    with open(os.path.join(uri, "_delta_log", f"{version:020d}.json")) as f:
        adds = [a["add"] for a in map(json.loads, f) if a.get("add") and a["add"].get("dataChange", True)]
    out: list[int] = []
    for add in adds:
        col = pq.read_table(os.path.join(uri, unquote(add["path"])), columns=[column]).column(column)
        out += col.filter(pc.greater_equal(col, at_least)).to_pylist()
    return out


def _pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank); NaN for no values (a run that saw nothing is still reported)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


def lag_run(
    spark: Any, server: MariaDBServer, settings: ConnectionSettings, work: str, base: dict[str, Any],
    lake_from: str, rows: int, rate: float, seconds: float, timings: Timings, max_events: int | None,
    trigger: float, rows_per_tx: int = 1, name: str = "lag",
) -> dict[str, Any]:
    start = offset_now(settings)
    store, sink = pipeline(work, name, manifest_from(base, start), lake_from)
    uri = sink.table_uri(TABLE)
    opts = StreamOptions(trigger_seconds=trigger, readers=2, max_events_per_trigger=max_events,
                         rewrite_below_mb=LAG_REWRITE_BELOW_MB)
    query = start_stream(spark, settings, store, sink, opts)
    try:
        # the query is up once it has run its first (empty) trigger
        deadline = time.monotonic() + 120
        while not query.recentProgress:
            if query.exception() is not None:
                raise RuntimeError(f"the lag stream failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError("the lag stream made no progress in 120 s")
            time.sleep(0.1)
        # and has applied a first change (its Python workers started, as in a stream that has been running)
        server.execute("UPDATE orders SET created = NOW(6) WHERE id = 1", database="bench")
        wait_caught_up(query, offset_now(settings), timeout=300)
        v0 = DeltaTable(uri).version()
        # writer and poller in processes of their own, as a source application and a lake reader are:
        # not contending for the stream driver's GIL (tests/support/lag_writers.py)
        poller = ProcessPoller(uri, POLL_SECONDS)
        poller.start()
        keys = random.Random(11).sample(range(1, rows + 1), min(rows, int(rate * seconds) + 1))
        writer = ProcessWriter(update_keys, socket=server.socket, database="bench", keys=keys, rate=rate,
                               seconds=seconds, rows_per_tx=rows_per_tx, first_value=SEQ_BASE)  # fmt: skip
        t0 = time.monotonic()
        writer.start()
        writer.join()
        write_secs = time.monotonic() - t0
        if writer.error is not None:
            raise RuntimeError(f"the lag writer failed: {writer.error}")
        wait_caught_up(query, offset_now(settings), timeout=300)
        time.sleep(2 * POLL_SECONDS)
        poller.stop()
    finally:
        stop_gracefully(query)

    # which of the writer's values each version made visible first: the values in the data files it
    # added (a MERGE's rewritten files also hold values visible before; the first version counts),
    # visible from the first version the poller saw at or after it
    visible: dict[int, float] = {}
    committed_at: dict[int, float] = {}
    history = {int(h["version"]): h["timestamp"] / 1000 for h in DeltaTable(uri).history() if "version" in h}
    seen = sorted(x for x in poller.seen if x > v0)
    for u in range(v0 + 1, (seen[-1] if seen else v0) + 1):
        at = next(poller.seen[x] for x in seen if x >= u)
        for seq in values_added(uri, u, "customer", SEQ_BASE):
            visible.setdefault(seq, at)
            committed_at.setdefault(seq, history.get(u, at))
    lags = [visible[s] - c for s, c in writer.committed.items() if s in visible]
    commit_lags = [committed_at[s] - c for s, c in writer.committed.items() if s in committed_at]
    missing = len(writer.committed) - len(lags)
    if missing:
        log.warning("lag: %d of %d changes never became visible", missing, len(writer.committed))
    if poller.errors:
        log.warning("lag: %d Delta log reads failed and were retried, the first: %s", len(poller.errors),
                    poller.errors[0])  # fmt: skip
    status_lags = [b["status_lag_s"] for b in timings.of(name) if b["status_lag_s"] is not None]
    batches = timings.of(name)
    written = [w for w in rewritten_per_version(uri, v0, max(poller.seen)) if w[1]]
    by_time = sorted((c, visible[s] - c) for s, c in writer.committed.items() if s in visible)
    third = max(1, len(by_time) // 3)
    out = {
        "lag_changes": len(writer.committed),
        "lag_write_rate": round(len(writer.committed) / write_secs, 1),
        "lag_missing": missing,
        "lag_p50_s": round(_pct(lags, 0.50), 3),
        "lag_p90_s": round(_pct(lags, 0.90), 3),
        "lag_p99_s": round(_pct(lags, 0.99), 3),
        "lag_max_s": round(max(lags), 3) if lags else None,
        "lag_commit_p50_s": round(_pct(commit_lags, 0.50), 3),
        "lag_commit_p99_s": round(_pct(commit_lags, 0.99), 3),
        "lag_status_p50_s": round(_pct(status_lags, 0.50), 3) if status_lags else None,
        "lag_status_max_s": round(max(status_lags), 3) if status_lags else None,
        "lag_batches": len(batches),
        "lag_batch_rows_mean": round(statistics.mean(b["rows"] for b in batches), 1) if batches else 0,
        "lag_batch_spark_s_mean": round(statistics.mean(b["spark_s"] for b in batches), 3) if batches else None,
        "lag_batch_merge_s_mean": round(statistics.mean(b["merge_s"] for b in batches), 3) if batches else None,
        "lag_batch_apply_s_mean": round(statistics.mean(b["apply_s"] for b in batches), 3) if batches else None,
        "lag_delta_versions": len([v for v in poller.seen if v > v0]),
        # rows and bytes each batch wrote to the table (its rewrite), against the rows it changed
        "lag_bytes_rewritten_per_batch": round(statistics.median(b for b, _ in written)) if written else 0,
        "lag_rows_rewritten_per_batch": round(statistics.median(r for _, r in written)) if written else 0,
        "lag_rows_rewritten_per_changed_row": round(statistics.median(r for _, r in written)
                                                    / max(1.0, statistics.median(b["rows"] for b in batches)), 1)
        if written and batches else None,
        # growth: the lag of the first and the last third of the changes
        "lag_p99_first_third_s": round(_pct([lag for _, lag in by_time[:third]], 0.99), 3) if by_time else None,
        "lag_p99_last_third_s": round(_pct([lag for _, lag in by_time[-third:]], 0.99), 3) if by_time else None,
        "lag_trigger_seconds": trigger,
        "lag_rows_per_tx": rows_per_tx,
        "lag_sink_matches_source": check_sink(server, sink),
    }
    log.info("lag: %s", out)
    return out


# ----------------------------------------------------------------------------- main
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=300_000, help="row changes to stream (UPDATEs)")
    p.add_argument("--rows", type=int, default=None, help="table rows (default: --events)")
    p.add_argument("--tx-rows", type=int, default=1000, help="rows per UPDATE transaction")
    p.add_argument("--chunk-size", type=int, default=50_000)
    p.add_argument("--lag-seconds", type=float, default=30.0)
    p.add_argument("--lag-rate", type=float, default=500.0, help="changed rows/s of the lag scenario")
    p.add_argument("--lag-rate-high", type=float, default=5000.0,
                   help="changed rows/s of the high-load lag scenario (lag_p99_s_5k); 0 skips it")
    p.add_argument("--lag-high-tx-rows", type=int, default=10, help="rows per transaction of the high-load scenario")
    p.add_argument("--lag-trigger", type=float, default=StreamOptions().trigger_seconds,
                   help="trigger interval of the lag streams (default: the product's default)")
    p.add_argument("--lag-rewrite-below-mb", type=int, default=StreamOptions().rewrite_below_mb,
                   help="the lag streams' rewrite_below_mb (tables up to this size are rewritten, not MERGEd)")
    p.add_argument("--only-lag", action="store_true", help="skip the throughput runs (lag scenarios only)")
    p.add_argument("--big-table", action="store_true",
                   help="the big-table scenario only (issue 16 item 2): --rows 20,000,000 unless given, 125,000-row "
                        "chunks, --lag-rate rows/s for 600 s unless --lag-seconds is given; big_table_* figures")
    p.add_argument("--no-breakdown", action="store_true", help="skip the per-layer single-core breakdown")
    p.add_argument("--max-events-per-trigger", type=int, default=StreamOptions().max_events_per_trigger)
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved throughput runs of each kind; medians are the headline, the best beside them")
    p.add_argument("--warmup-events", type=int, default=100_000, help="changes of the untimed warm-up stream")
    p.add_argument("--driver-memory", default="4g", help="spark.driver.memory (Spark's default 1g: see RESULTS.md)")
    p.add_argument("--huge-tx-rows", type=int, default=1_000_000,
                   help="rows of the huge-transaction scenario's table (one UPDATE of all of them); 0 skips it")
    p.add_argument("--huge-tx-rounds", type=int, default=3, help="interleaved rounds of the huge-transaction scenario")
    p.add_argument("--only-huge-tx", action="store_true", help="run the huge-transaction scenario only")
    args = p.parse_args()
    global LAG_REWRITE_BELOW_MB
    LAG_REWRITE_BELOW_MB = args.lag_rewrite_below_mb
    if args.big_table:  # one long lag run into a big table: nothing else
        args.rows = args.rows or 20_000_000
        args.only_lag, args.huge_tx_rows, args.lag_rate_high, args.no_breakdown = True, 0, 0.0, True
        args.chunk_size = 125_000 if args.chunk_size == 50_000 else args.chunk_size
        args.lag_seconds = 600.0 if args.lag_seconds == 30.0 else args.lag_seconds
    rows = args.rows or args.events
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("airflow_provider_mysqlcdc.sinks.delta_merge", "airflow_provider_mysqlcdc.stream.applier",
                  "airflow_provider_mysqlcdc.stream.job", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    load_start = os.getloadavg()
    t_begin = time.monotonic()
    work = tempfile.mkdtemp(prefix="mysqlcdc-bench-stream-")
    server = MariaDBServer()
    server.start()
    spark = None
    meter = CpuMeter()
    timings = Timings(meter)
    try:
        t = time.monotonic()
        if not args.only_huge_tx:
            load(server, rows)
            log.info("loaded %d rows in %.1fs", rows, time.monotonic() - t)
        settings = server.cdc_settings()
        spark = build_spark_session(
            "mysqlcdc-bench-stream", master="local[2]", extra_conf={"spark.driver.memory": args.driver_memory}
        )
        log.info("spark.driver.memory=%s", spark.sparkContext.getConf().get("spark.driver.memory"))

        huge: dict[str, Any] = {}
        if args.huge_tx_rows:
            huge = huge_tx_scenario(spark, server, settings, work, args.huge_tx_rows, args.tx_rows, args.huge_tx_rounds)
        if args.only_huge_tx:
            print(json.dumps({**huge, "total_seconds": round(time.monotonic() - t_begin, 1),
                              "load_average_start": [round(x, 2) for x in load_start],
                              "load_average_1m": round(os.getloadavg()[0], 2)}))  # fmt: skip
            return 0

        # snapshot -> Delta, manifest
        snap_store = StateStore(f"{work}/state", "snap")
        snap_lake = f"{work}/lake-snap"
        sink = DeltaSink(snap_lake)
        t = time.monotonic()
        with settings.connect() as conn:
            plan = plan_snapshot(conn, [TABLE], args.chunk_size, 8)
        snap_store.write_plan("p1", plan.to_dict())
        for g in plan.groups:
            run_snapshot_group(spark, settings, snap_store, "p1", g.group_id, sink)
        base = build_manifest(plan, snap_store.read_all_results("p1"))
        log.info("snapshot: %d groups, %d chunks in %.1fs", len(plan.groups), len(plan.splits), time.monotonic() - t)

        # warm-up: a short stream over a few transactions, so that the measured runs find Spark's
        # Python workers started and their imports done (the first stream of a session pays that)
        warm_start = offset_now(settings)
        warm_changes = bulk_updates(server, rows, max(2 * args.tx_rows, args.warmup_events), args.tx_rows)
        warm_end = offset_now(settings)
        warm_lake = f"{work}/lake-warm"
        throughput_run(spark, settings, work, "warm", manifest_from(base, warm_start), snap_lake, warm_end, 2,
                       timings, warm_changes, args.max_events_per_trigger)

        # the changes to stream
        start = offset_now(settings)
        t = time.monotonic()
        # (--only-lag: none, so that the warm-up's lake still equals the source for the lag streams)
        changed = bulk_updates(server, rows, 0 if args.only_lag else args.events, args.tx_rows)
        end = offset_now(settings)
        load_secs = time.monotonic() - t
        with settings.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (start.file, start.pos))
            binlog_events = len(cur.fetchall()) if start.file == end.file else None
        log.info("%d row changes in %.1fs (%s -> %s, %s binlog events)", changed, load_secs, start, end, binlog_events)
        manifest = manifest_from(base, start)

        # The machine is shared, so each throughput figure is the best of --repeats runs, interleaved
        # (bare, stream, single reader, bare, ...); every sample is reported with its foreign load.
        cap = args.max_events_per_trigger
        bare_runs: list[dict[str, Any]] = []
        r2_runs: list[dict[str, Any]] = []
        r1_runs: list[dict[str, Any]] = []
        parts: dict[str, Any] = {}
        sinks_ok = True
        for rep in range(0 if args.only_lag else args.repeats):
            mark = meter.start()
            bare_rows, bare_secs, bare_cpu = bare_reader(settings, start, 7101 + rep)
            bare_runs.append({"rows": bare_rows, "seconds": round(bare_secs, 3), "cpu_seconds": round(bare_cpu, 3),
                              "rows_per_s": round(bare_rows / bare_secs), **meter.stop(mark)})
            if bare_rows != changed:
                log.warning("bare reader saw %d rows, expected %d", bare_rows, changed)
            log.info("bare reader: %s", bare_runs[-1])
            if rep == 0 and not args.no_breakdown:
                parts = breakdown(settings, work, manifest, warm_lake, start, end, timings, bare_cpu)
            for readers, runs in ((2, r2_runs), (1, r1_runs)):
                name = f"r{readers}-{rep}"
                runs.append(throughput_run(spark, settings, work, name, manifest, warm_lake, end, readers, timings,
                                           changed, cap))
                sinks_ok = check_sink(server, DeltaSink(f"{work}/lake-{name}")) and sinks_ok
        lag_lake = f"{work}/lake-warm" if args.only_lag else f"{work}/lake-r2-0"
        lag = lag_run(spark, server, settings, work, base, lag_lake, rows, args.lag_rate, args.lag_seconds, timings,
                      cap, args.lag_trigger)
        lag_high: dict[str, Any] = {}
        if args.lag_rate_high:
            lag_high = lag_run(spark, server, settings, work, base, f"{work}/lake-lag", rows, args.lag_rate_high,
                               args.lag_seconds, timings, cap, args.lag_trigger, args.lag_high_tx_rows, "lag5k")
        if args.big_table:
            print(json.dumps({"big_table_rows": rows, "big_table_lag_p50_s": lag["lag_p50_s"],
                              "big_table_lag_p99_s": lag["lag_p99_s"],
                              "big_table_bytes_rewritten_per_batch": lag["lag_bytes_rewritten_per_batch"],
                              "big_table_rows_rewritten_per_batch": lag["lag_rows_rewritten_per_batch"],
                              "big_table_rows_rewritten_per_changed_row": lag["lag_rows_rewritten_per_changed_row"],
                              "lag": lag, "sink_matches_source": lag["lag_sink_matches_source"],
                              "total_seconds": round(time.monotonic() - t_begin, 1),
                              "load_average_1m": round(os.getloadavg()[0], 2)}))  # fmt: skip
            return _exit_code(lag["lag_sink_matches_source"])
        if args.only_lag:
            print(json.dumps({"lag_p50_s": lag["lag_p50_s"], "lag_p99_s": lag["lag_p99_s"],
                              "lag_p99_s_5k": lag_high.get("lag_p99_s"), "lag": lag, "lag_5k": lag_high,
                              "sink_matches_source": lag["lag_sink_matches_source"]
                              and lag_high.get("lag_sink_matches_source", True),
                              "total_seconds": round(time.monotonic() - t_begin, 1),
                              "load_average_1m": round(os.getloadavg()[0], 2)}))  # fmt: skip
            return _exit_code(lag["lag_sink_matches_source"] and lag_high.get("lag_sink_matches_source", True))
        bare_median = statistics.median(r["rows_per_s"] for r in bare_runs)
        r2_median = statistics.median(r["rows_per_s"] for r in r2_runs)
        r1_median = statistics.median(r["rows_per_s"] for r in r1_runs)
        bare = max(bare_runs, key=lambda r: r["rows_per_s"])
        bare_rps = bare["rows_per_s"]
        r2 = max(r2_runs, key=lambda r: r["rows_per_s"])
        r1 = max(r1_runs, key=lambda r: r["rows_per_s"])

        out: dict[str, Any] = {
            "events": changed,
            "table_rows": rows,
            "tx_rows": args.tx_rows,
            "binlog_events": binlog_events,
            "ratio_of_medians_vs_bare_reader": round(r2_median / bare_median, 3),
            "ratio_single_reader_of_medians_vs_bare_reader": round(r1_median / bare_median, 3),
            "ratio_per_round": [round(a["rows_per_s"] / b["rows_per_s"], 3)
                                for a, b in zip(r2_runs, bare_runs, strict=True)],
            "stream_rows_per_s": r2["rows_per_s"],
            "bare_reader_rows_per_s": round(bare_rps),
            "ratio_vs_bare_reader": round(r2["rows_per_s"] / bare_rps, 3),
            "single_reader_rows_per_s": r1["rows_per_s"],
            "ratio_single_reader_vs_bare_reader": round(r1["rows_per_s"] / bare_rps, 3),
            "ratio_incl_startup_vs_bare_reader": round(r2["rows_per_s_incl_startup"] / bare_rps, 3),
            "lag_p50_s": lag["lag_p50_s"],
            "lag_p99_s": lag["lag_p99_s"],
            "lag_p99_s_5k": lag_high.get("lag_p99_s"),
            "bare_reader": bare,
            "bare_reader_rows_per_cpu_s": round(bare["rows"] / bare["cpu_seconds"]),
            "stream_rows_per_cpu_s": r2["rows_per_cpu_s"],
            "max_events_per_trigger": cap,
            "driver_memory": args.driver_memory,
            "stream": r2,
            "single_reader": r1,
            "sink_matches_source": sinks_ok and lag["lag_sink_matches_source"]
            and lag_high.get("lag_sink_matches_source", True),
            "samples": {
                "bare_reader": [(r["rows_per_s"], r["foreign_cores"]) for r in bare_runs],
                "stream": [(r["rows_per_s"], r["cpu"]["foreign_cores"]) for r in r2_runs],
                "single_reader": [(r["rows_per_s"], r["cpu"]["foreign_cores"]) for r in r1_runs],
                "_": "(rows/s, foreign cores busy during the run) per repeat",
            },
            "breakdown": parts,
            "lag": lag,
            "lag_5k": lag_high,
            "huge_tx": huge,
            "total_seconds": round(time.monotonic() - t_begin, 1),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(out))
        return _exit_code(out["sink_matches_source"])
    finally:
        if spark is not None:
            spark.stop()
        server.destroy()
        shutil.rmtree(work, ignore_errors=True)


def _exit_code(sink_matches_source: bool) -> int:
    """Non-zero when a scenario's sink differs from its source: the figures of a wrong run are void."""
    if not sink_matches_source:
        log.error("the sink differs from the source after a scenario (see the warnings above)")
    return 0 if sink_matches_source else 1


if __name__ == "__main__":
    sys.exit(main())
