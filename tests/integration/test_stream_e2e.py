"""The product's promise: snapshot under a random writer, stream from the min HW, sink == source.

Three tables (BIGINT key, composite (VARCHAR, INT) key, VARCHAR key under a case-insensitive
collation) of 50,000 rows each are snapshotted in several chunk groups of >= 10 chunks per table
while a writer runs inserts, updates, deletes and key moves across chunk boundaries at >= 100
transactions/s; the stream starts from the minimum high watermark; the writer keeps going for a
while, then stops; once the stream has reached the server's offset, every Delta table must equal
its source row for row and column for column.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.job import (
    StreamOptions,
    start_stream,
    stop_gracefully,
    wait_until_caught_up,
)
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.verify import compare

ROWS = 50_000
CHUNK = 5_000
REPO = Path(__file__).resolve().parents[2]


def snapshot_all(spark: Any, cdc_settings: Any, store: StateStore, sink: DeltaSink, tables: list[str]) -> Any:
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, tables, CHUNK, 8)
    store.write_plan("p1", plan.to_dict())
    for t in tables:
        assert sum(1 for s in plan.splits if s.table == t) >= 10
    assert len(plan.groups) >= 2
    for g in plan.groups:
        run_snapshot_group(spark, cdc_settings, store, "p1", g.group_id, sink)
    manifest = build_manifest(plan, store.read_all_results("p1"))
    store.write_manifest(manifest)
    return plan


def assert_sink_equals_source(cdc_settings: Any, plan: Any, sink: DeltaSink, tables: list[str]) -> None:
    with cdc_settings.connect() as conn:
        for t in tables:
            cmp = compare(conn, plan.tables[t], sink.read(t))
            assert cmp.match, f"{t}: {cmp.first_difference}"


@pytest.mark.parametrize("rewrite_below_mb", [16, 0], ids=["default", "big-tables"])
def test_snapshot_then_stream_under_random_writer(mariadb, db, cdc_settings, spark, tmp_path,  # type: ignore[no-untyped-def]
                                                  rewrite_below_mb) -> None:  # fmt: skip
    """``big-tables``: every table is treated as big — the BIGINT-keyed one takes its batches with
    deletion vectors, the others by MERGE (sinks/delta_dv_table.py)."""
    tables = make_tables(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "e2e")
    sink = DeltaSink(str(tmp_path / "lake"))
    writer = RandomWriter(mariadb, db)
    writer.start()
    t0 = time.monotonic()
    try:
        plan = snapshot_all(spark, cdc_settings, store, sink, tables)
        opts = StreamOptions(trigger_seconds=0.5, readers=2, rewrite_below_mb=rewrite_below_mb)
        query = start_stream(spark, cdc_settings, store, sink, opts)
        try:
            time.sleep(8)  # the writer keeps going while the stream runs
            writer.stop_event.set()
            writer.join()
            elapsed = time.monotonic() - t0
            with cdc_settings.connect() as conn:
                target = current_offset(conn)
            wait_until_caught_up(query, target)
        finally:
            stop_gracefully(query)
    finally:
        writer.stop_event.set()
    assert writer.transactions / elapsed >= 100, f"writer only reached {writer.transactions / elapsed:.0f} tx/s"
    assert_sink_equals_source(cdc_settings, plan, sink, tables)
    with_vectors = [t for t in tables if "deletionVectors" in (sink.open(t).protocol().reader_features or [])]
    if rewrite_below_mb == 0:  # the BIGINT-keyed table; the composite and VARCHAR keys keep the MERGE
        assert with_vectors == [f"{db}.t_int"], with_vectors


@pytest.mark.timeout(900)
@pytest.mark.parametrize("rewrite_below_mb", [16, 0], ids=["default", "big-tables"])
def test_stream_driver_killed_mid_batch_then_restarted(mariadb, db, cdc_settings, spark, tmp_path,  # type: ignore[no-untyped-def]
                                                       rewrite_below_mb) -> None:  # fmt: skip
    """kill -9 of the stream's spark-submit driver, restart from the checkpoint: no loss, no duplicate.
    ``big-tables``: the BIGINT-keyed table's batches (and their replay) go by deletion vectors."""
    tables = make_tables(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "crash")
    sink = DeltaSink(str(tmp_path / "lake"))
    writer = RandomWriter(mariadb, db, seed=2)
    writer.start()
    try:
        plan = snapshot_all(spark, cdc_settings, store, sink, tables)
        env = dict(os.environ, MYSQLCDC_SOURCE=json.dumps(cdc_settings.to_dict()), PYSPARK_PYTHON=sys.executable)
        cmd = [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--jars",
            "/usr/share/java/mariadb-java-client.jar",
            str(REPO / "spark_jobs" / "stream.py"),
            "--state-root",
            str(tmp_path / "state"),
            "--pipeline-id",
            "crash",
            "--sink-root",
            str(tmp_path / "lake"),
            "--trigger-seconds",
            "0.5",
            "--max-events-per-trigger",
            "500",
            "--rewrite-below-mb",
            str(rewrite_below_mb),
        ]
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        # wait for a few committed batches, then kill -9 while batches keep coming
        deadline = time.monotonic() + 240
        while (store.read_json("stream/status.json") or {}).get("batch_id", -1) < 3:
            assert proc.poll() is None, "the stream job died on its own"
            assert time.monotonic() < deadline, "the stream never committed a batch"
            time.sleep(0.2)
        time.sleep(0.7)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(3)  # the writer goes on while the stream is down
        writer.stop_event.set()
        writer.join()
        with cdc_settings.connect() as conn:
            target = current_offset(conn)
        opts = StreamOptions(trigger_seconds=0.5, rewrite_below_mb=rewrite_below_mb)
        query = start_stream(spark, cdc_settings, store, sink, opts)
        try:
            wait_until_caught_up(query, target)
        finally:
            stop_gracefully(query)
    finally:
        writer.stop_event.set()
    assert_sink_equals_source(cdc_settings, plan, sink, tables)
    with_vectors = [t for t in tables if "deletionVectors" in (sink.open(t).protocol().reader_features or [])]
    if rewrite_below_mb == 0:  # the BIGINT-keyed table; the composite and VARCHAR keys keep the MERGE
        assert with_vectors == [f"{db}.t_int"], with_vectors


@pytest.mark.timeout(900)
def test_rotations_and_server_restart_while_streaming(cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """FLUSH BINARY LOGS several times and a MariaDB restart under the running stream: final state equal."""
    from tests.support.mariadb import MariaDBServer

    server = MariaDBServer()
    server.start()
    try:
        server.execute("CREATE DATABASE rr")
        tables = make_tables(server, "rr")
        settings = server.cdc_settings()
        store = StateStore(str(tmp_path / "state"), "restart")
        sink = DeltaSink(str(tmp_path / "lake"))
        plan = snapshot_all(spark, settings, store, sink, tables)
        query = start_stream(spark, settings, store, sink, StreamOptions(trigger_seconds=0.5, readers=2))
        try:
            for round_ in range(3):
                writer = RandomWriter(server, "rr", rate=120, seed=10 + round_)
                writer.start()
                for _ in range(3):
                    time.sleep(0.7)
                    server.execute("FLUSH BINARY LOGS")
                writer.stop_event.set()
                writer.join()
                if round_ == 1:
                    server.restart()  # the stream's connections drop; it must reconnect and go on
            with settings.connect() as conn:
                target = current_offset(conn)
            wait_until_caught_up(query, target)
        finally:
            stop_gracefully(query)
        assert_sink_equals_source(settings, plan, sink, tables)
    finally:
        server.destroy()
