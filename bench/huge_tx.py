"""Huge-transaction scenario of the streaming benchmark (``bench/stream.py --huge-tx-rows N``).

One transaction updating every row of an N-row table (default 1,000,000) against the stream's usual
throughput on the same table: the same N rows updated in transactions of ``--tx-rows`` rows. Each
shape lives on its own private server (the same table loaded and snapshotted on both), so each
stream's range ends at its server's head and the stream idles there. Both ranges are streamed by
the stream job as the DAG launches it — ``spark-submit`` of
``jobs/stream.py`` with the default settings (Spark's default driver memory, the default caps,
``apply_memory_mb``) — each from a fresh copy of the snapshot and its own state, in interleaved
rounds (usual, huge, huge, usual, ...). A run is timed from the moment the stream reports running
to the moment its checkpoint has committed the range's end; the peak RSS is the largest sum of the
resident memory of every process of the job (spark-submit's JVM, the driver's Python, Spark's
Python daemon and workers), sampled every 0.2 s.

Reported: ``huge_tx_seconds``, ``huge_tx_rows_per_s``, ``huge_tx_peak_rss_mb`` (medians over the
rounds), the usual run's figures, and ``huge_tx_ratio_vs_usual`` = median huge rows/s / median
usual rows/s (target >= 0.5; peak target < 3 GB).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import RUN, STATUS, checkpoint_offset, request_stop
from tests.support.bench_data import load_orders
from tests.support.manifests import manifest_from
from tests.support.mariadb import MariaDBServer

log = logging.getLogger("bench.huge_tx")

TABLE = "bench.huge"
JOB = Path(__file__).resolve().parents[1] / "airflow_provider_mysqlcdc" / "jobs" / "stream.py"


def _offset(settings: ConnectionSettings) -> BinlogOffset:
    with settings.connect() as conn:
        off = current_offset(conn)
    return BinlogOffset(off.file, off.pos)


class RssSampler(threading.Thread):
    """Peak of the summed RSS of a process and all its descendants."""

    def __init__(self, pid: int, every: float = 0.2):
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.every = every
        self.peak = 0
        self.peak_by_kind: dict[str, int] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            total = 0
            kinds: dict[str, int] = {}
            try:
                procs = [self.proc, *self.proc.children(recursive=True)]
            except psutil.Error:
                return
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    name = _kind(p)
                except psutil.Error:
                    continue
                total += rss
                kinds[name] = kinds.get(name, 0) + rss
            if total > self.peak:
                self.peak, self.peak_by_kind = total, kinds
            self.stop_event.wait(self.every)


def _kind(p: psutil.Process) -> str:
    if p.name() == "java":
        return "jvm"
    cmd = " ".join(p.cmdline())
    if "jobs/stream.py" in cmd:
        return "driver_python"
    if "python" in p.name() or "python" in cmd:
        return "spark_python_workers"
    return "other"


def _stream_range(
    settings: ConnectionSettings, work: Path, name: str, base: Manifest, snap_lake: Path,
    start: BinlogOffset, end: BinlogOffset, rows: int,
) -> dict[str, Any]:
    """Stream ``[start, end)`` with the stream job on default settings; time, peak RSS, batches."""
    store = StateStore(str(work / "state"), name)
    store.write_manifest(manifest_from(base, start))
    lake = work / f"lake-{name}"
    shutil.copytree(snap_lake, lake)
    env = dict(os.environ, MYSQLCDC_SOURCE=json.dumps(settings.to_dict()), PYSPARK_PYTHON=sys.executable)
    cmd = [
        str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
        "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
        "--conf", "spark.driver.extraJavaOptions=-XX:+ExitOnOutOfMemoryError",
        "--jars", "/usr/share/java/mariadb-java-client.jar",
        str(JOB), "--state-root", str(work / "state"), "--pipeline-id", name, "--sink-root", str(lake),
        "--trigger-seconds", "0.5",
    ]  # fmt: skip
    log_path = work / f"{name}.log"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    sampler = RssSampler(proc.pid)
    sampler.start()
    try:
        deadline = time.monotonic() + 600
        while (store.read_json(RUN) or {}).get("state") != "running":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the stream did not start; see {log_path}")
            time.sleep(0.05)
        t0 = time.monotonic()
        while True:
            off = checkpoint_offset(store)
            if off is not None and off >= end:
                break
            run = store.read_json(RUN) or {}
            if proc.poll() is not None or run.get("state") == "failed":
                raise RuntimeError(f"{name}: the stream died: {run.get('error')} (log {log_path})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the stream did not reach {end} in time (log {log_path})")
            time.sleep(0.1)
        seconds = time.monotonic() - t0
        status = store.read_json(STATUS) or {}
        request_stop(store, timeout=120)
    finally:
        sampler.stop_event.set()
        sampler.join()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    rss_mb = round(sampler.peak / 2**20)
    out = {
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "peak_rss_mb": rss_mb,
        "peak_rss_mb_by_kind": {k: round(v / 2**20) for k, v in sampler.peak_by_kind.items()},
        "last_batch_id": status.get("batch_id"),
        "bounded_apply": status.get("bounded_apply"),
        "lake": str(lake),
    }
    log.info("%s: %s", name, out)
    return out


def _prepared(spark: Any, server: MariaDBServer, work: Path, rows: int) -> tuple[dict[str, Any], Path, BinlogOffset]:
    """``bench.huge`` with ``rows`` rows on ``server``, snapshotted; (manifest base, lake, offset after)."""
    t = time.monotonic()
    load_orders(server, rows, table="huge")
    settings = server.cdc_settings()
    store = StateStore(str(work / "state"), "snap")
    lake = work / "lake-snap"
    sink = DeltaSink(str(lake))
    with settings.connect() as conn:
        plan = plan_snapshot(conn, [TABLE], 125_000, 8)
    store.write_plan("p1", plan.to_dict())
    for g in plan.groups:
        run_snapshot_group(spark, settings, store, "p1", g.group_id, sink)
    log.info("huge-tx: %d rows loaded and snapshotted in %.1fs", rows, time.monotonic() - t)
    return build_manifest(plan, store.read_all_results("p1")), lake, _offset(settings)


def huge_tx_scenario(
    spark: Any, server: MariaDBServer, settings: ConnectionSettings, work_dir: str, rows: int, tx_rows: int,
    rounds: int,
) -> dict[str, Any]:
    """Two servers, so each stream's range ends at its server's head and the stream idles there:
    ``server`` gets the usual transactions, a second private server the one huge transaction."""
    work = Path(work_dir) / "huge"
    huge_server = MariaDBServer()
    huge_server.start()
    try:
        usual = _prepared(spark, server, work / "usual", rows)
        huge = _prepared(spark, huge_server, work / "huge", rows)
        conn = server.root_connection("bench")
        try:
            with conn.cursor() as cur:
                for lo in range(1, rows + 1, tx_rows):
                    cur.execute("UPDATE huge SET customer = customer + 1, amount = amount + 0.01, flag = (flag + 1) "
                                "%% 3 WHERE id BETWEEN %s AND %s", (lo, min(rows, lo + tx_rows - 1)))  # fmt: skip
        finally:
            conn.close()
        usual_end = _offset(settings)
        t = time.monotonic()
        huge_server.execute("UPDATE huge SET customer = customer + 1, amount = amount + 0.01, flag = (flag + 1) % 3",
                            database="bench")  # fmt: skip
        huge_secs = time.monotonic() - t
        huge_end = _offset(huge_server.cdc_settings())
        start = huge[2]
        binlog_mb = round((huge_end.pos - start.pos) / 2**20, 1) if huge_end.file == start.file else None
        log.info("huge-tx: usual range %s -> %s; huge transaction %s -> %s (%s MiB of binlog, %.1fs on the server)",
                 usual[2], usual_end, start, huge_end, binlog_mb, huge_secs)  # fmt: skip

        runs: dict[str, list[dict[str, Any]]] = {"usual": [], "huge": []}
        matches = True
        for r in range(rounds):
            for kind in (("usual", "huge") if r % 2 == 0 else ("huge", "usual")):
                srv, (base, lake, begin), end = (
                    (server, usual, usual_end) if kind == "usual" else (huge_server, huge, huge_end)
                )
                res = _stream_range(srv.cdc_settings(), work / kind, f"{kind}-{r}", base, lake, begin, end, rows)
                matches = _sink_matches(srv, res["lake"]) and matches
                shutil.rmtree(res.pop("lake"), ignore_errors=True)
                runs[kind].append(res)
    finally:
        huge_server.destroy()

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    out = {
        "huge_tx_rows": rows,
        "huge_tx_binlog_mb": binlog_mb,
        "huge_tx_seconds": med("huge", "seconds"),
        "huge_tx_rows_per_s": round(med("huge", "rows_per_s")),
        "huge_tx_peak_rss_mb": round(med("huge", "peak_rss_mb")),
        "huge_tx_peak_rss_mb_max": max(r["peak_rss_mb"] for r in runs["huge"]),
        "usual_tx_rows": tx_rows,
        "usual_seconds": med("usual", "seconds"),
        "usual_rows_per_s": round(med("usual", "rows_per_s")),
        "usual_peak_rss_mb": round(med("usual", "peak_rss_mb")),
        "huge_tx_ratio_vs_usual": round(med("huge", "rows_per_s") / med("usual", "rows_per_s"), 3),
        "huge_tx_sink_matches_source": matches,
        "rounds": runs,
    }
    log.info("huge-tx: %s", {k: v for k, v in out.items() if k != "rounds"})
    return out


def _sink_matches(server: MariaDBServer, lake: str) -> bool:
    """Row count and the sums of the changed columns in source and sink."""
    import pyarrow.compute as pc

    src = server.query("SELECT COUNT(*), SUM(customer), SUM(amount), SUM(flag) FROM bench.huge")[0]
    t = DeltaSink(lake).read(TABLE).select(["customer", "amount", "flag"])
    dst = (t.num_rows, pc.sum(t["customer"]).as_py(), pc.sum(t["amount"]).as_py(), pc.sum(t["flag"]).as_py())
    ok = (int(src[0]), int(src[1]), src[2], int(src[3])) == dst
    if not ok:
        log.warning("huge-tx sink differs from source: source %s, sink %s", src, dst)
    return ok


__all__ = ["huge_tx_scenario"]
