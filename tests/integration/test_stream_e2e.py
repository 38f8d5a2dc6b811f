"""The product's promise: snapshot under a random writer, stream from the min HW, sink == source.

Three tables (BIGINT key, composite (VARCHAR, INT) key, VARCHAR key under a case-insensitive
collation) of 50,000 rows each are snapshotted in several chunk groups of >= 10 chunks per table
while a writer runs inserts, updates, deletes and key moves across chunk boundaries at >= 100
transactions/s; the stream starts from the minimum high watermark; the writer keeps going for a
while, then stops; once the stream has reached the server's offset, every Delta table must equal
its source row for row and column for column.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
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


def _launch(store: StateStore, settings: Any, tmp_path: Path, run_id: str) -> dict[str, Any]:
    """The stream launched detached, as the stream operator does (own session, driver log), running."""
    from airflow_provider_mysqlcdc.stream.launcher import launch_detached, wait_until_running

    env = dict(os.environ, MYSQLCDC_SOURCE=json.dumps(settings.to_dict()), PYSPARK_PYTHON=sys.executable)
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
           "--conf", "spark.ui.enabled=false", "--jars", "/usr/share/java/mariadb-java-client.jar",
           str(REPO / "spark_jobs" / "stream.py"),
           "--state-root", str(tmp_path / "state"), "--pipeline-id", store.pipeline_id,
           "--sink-root", str(tmp_path / "lake"), "--trigger-seconds", "0.5", "--run-id", run_id]  # fmt: skip
    handle = launch_detached(store, cmd, env, run_id)
    wait_until_running(store, run_id, handle["_proc"], handle["log_path"], timeout=240)
    return handle


def _wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.1)
    return found


def _own_errors(log: str) -> list[str]:
    """The driver's own ERROR lines (jobs/stream.py and its watcher write one when the stream ends badly)."""
    return [ln for ln in Path(log).read_text(errors="replace").splitlines() if " ERROR airflow_provider_mysqlcdc" in ln]


@pytest.mark.timeout(900)
def test_a_dead_stream_says_so_at_once_and_its_driver_log_says_why(  # type: ignore[no-untyped-def]
    mariadb, db, cdc_settings, spark, tmp_path, airflow_conn_env
) -> None:
    """A followed DDL leaves no error in the detached driver's log (the batch that met it is replayed:
    sink == source); a ``kill -9`` of the Python driver is ``lost`` in ``status`` within one heartbeat
    interval, with no stale lag; the sensor and verify fail with the cause and the fix, verify within
    its promised 30 s; a killed JVM leaves a driver that records ``failed`` and exits. Each killed
    driver's log holds exactly one line of the driver's own that says why."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_mysqlcdc.operators.verify import MySqlCdcVerifyOperator
    from airflow_provider_mysqlcdc.sensors.stream import MySqlCdcStreamSensor
    from airflow_provider_mysqlcdc.stream.control import (
        HEARTBEAT_SECONDS,
        pipeline_status,
        stream_state,
        wait_until_applied,
    )
    from airflow_provider_mysqlcdc.stream.failure import last_error_in_log
    from airflow_provider_mysqlcdc.triggers.stream import MySqlCdcStreamTrigger
    from tests.support.stream_thread import snapshot_tables

    tables = make_tables(mariadb, db, rows=3_000)
    store = StateStore(str(tmp_path / "state"), "dead")
    sink = DeltaSink(str(tmp_path / "lake"), owner="dead")
    snapshot_tables(spark, cdc_settings, store, sink, tables, 500, 4)
    writer = RandomWriter(mariadb, db, rate=60, seed=33, rows=3_000)
    writer.start()
    try:
        first = _launch(store, cdc_settings, tmp_path, "dead-1")
        time.sleep(2)
        mariadb.execute("ALTER TABLE t_comp MODIFY v BIGINT", database=db)  # widening: followed, the writer goes on
        time.sleep(3)
        writer.stop_event.set()
        writer.join()
        with cdc_settings.connect() as conn:
            wait_until_applied(store, current_offset(conn), timeout=240)
        log = Path(first["log_path"]).read_text(errors="replace")
        assert "stopping the query to follow it" in log and "was stopped" in log  # the DDL was met and followed
        routine = [ln for ln in log.splitlines() if re.search(r" (ERROR|FATAL|CRITICAL) |Traceback|falling behind", ln)]
        assert routine == [], routine[:5]
        with cdc_settings.connect() as conn:  # the batch that met the DDL was replayed, not committed: exact
            for t in tables:
                cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
                assert cmp.match, f"{t}: {cmp.first_difference}"

        # kill -9 of the Python driver: lost at once, no lag, the sensor, trigger and verify say so
        mariadb.execute("UPDATE t_int SET v = v + 1 WHERE id <= 10", database=db)  # the lake falls behind
        driver = store.read_run().pid
        os.kill(driver, signal.SIGKILL)
        st = _wait_for("status says lost", lambda: (s := stream_state(store))["state"] == "lost" and s,
                       HEARTBEAT_SECONDS)  # the product's promise for a driver on this host  # fmt: skip
        assert not st["running"] and f"driver process {driver} on this host is gone" in st["reason"], st
        with cdc_settings.connect() as conn:
            status = pipeline_status(store, current_offset(conn))
        assert status["stream_state"] == "lost" and status["behind_server"] is True
        assert status["lag_seconds"] is None and status["last_batch_age_seconds"] is not None, status
        assert "re-run the DAG" in status["stream_fix"]
        sensor = MySqlCdcStreamSensor(task_id="wait", pipeline_id="dead", state_root=str(tmp_path / "state"),
                                      deferrable=False)  # fmt: skip
        sensor._prepare()
        with pytest.raises(AirflowFailException, match=f"state lost: its driver process {driver}"):
            sensor.poke({})
        event = _first_event(MySqlCdcStreamTrigger(str(tmp_path / "state"), "dead", sensor._target, None, 0.1))
        assert event["status"] == "error" and "Re-run the DAG" in event["message"], event
        verify = MySqlCdcVerifyOperator(task_id="verify", pipeline_id="dead", state_root=str(tmp_path / "state"),
                                        sink_root=str(tmp_path / "lake"))  # fmt: skip
        t0 = time.monotonic()
        with pytest.raises(AirflowFailException, match=r"the stream is not running \(state lost") as failed:
            verify.execute({})
        assert time.monotonic() - t0 < 30, "verify promises an answer within 30 s on a dead stream"
        assert "Re-run the DAG" in str(failed.value)
        said = _wait_for("the killed driver's line", lambda: _own_errors(first["log_path"]), 60)
        assert len(said) == 1 and f"driver process {driver} ended without a word" in said[0], said
        assert last_error_in_log(first["log_path"]) == said[0].strip()[:400]

        # kill -9 of the spark-submit JVM: the Python driver records failed and exits, its log says why
        second = _launch(store, cdc_settings, tmp_path, "dead-2")
        driver = store.read_run().pid
        os.kill(second["launcher_pid"], signal.SIGKILL)
        st = _wait_for("the driver records the failure", lambda: (s := stream_state(store))["state"] == "failed" and s,
                       60)  # fmt: skip
        assert "Spark driver JVM went away" in st["reason"] and "py4j" not in st["reason"].lower(), st
        _wait_for("the driver process exits", lambda: not os.path.exists(f"/proc/{driver}") or _zombie(driver), 60)
        said = _own_errors(second["log_path"])
        assert len(said) == 1 and "the stream failed: the Spark driver JVM went away" in said[0], said
        assert last_error_in_log(second["log_path"]) == said[0].strip()[:400]
    finally:
        writer.stop_event.set()
        for pid in (store.read_run().pid, (store.read_handle() or None) and store.read_handle().launcher_pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _first_event(trigger: Any, timeout: float = 30.0) -> dict[str, Any]:
    import asyncio

    async def first() -> dict[str, Any]:
        async for ev in trigger.run():
            return ev.payload
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), timeout))
