"""One transaction of hundreds of thousands of rows, streamed and snapshotted in bounded memory.

A private MariaDB holds ``big.t`` (BIGINT key, INT, VARCHAR(400) of ~300 characters, DECIMAL):
300,000 rows, ~100 MB of change blocks when every row changes. The stream runs as the example DAG
runs it — ``spark-submit`` of the stream job, ``local[2]`` — with ``--driver-memory 512m`` (the
least Spark accepts; the old path collected such a batch into the driver JVM and died of
``OutOfMemoryError``) and ``apply_memory_mb`` 16, so the driver's Python folds the batch in several
spilled buckets. Each test ends with the Delta table equal to the source, row for row.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from airflow_provider_mysqlcdc.core.changelog import order_key
from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import read_changelog
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import RUN, STATUS, request_stop, stream_state, wait_until_applied
from tests.support.mariadb import MariaDBServer
from tests.support.verify import compare

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
ROWS = 300_000
TABLE = "big.t"
DRIVER_MEMORY = "512m"
APPLY_MEMORY_MB = 16


@pytest.fixture(scope="module")
def big_server() -> Iterator[MariaDBServer]:
    server = MariaDBServer()
    server.start()
    try:
        server.execute(
            "CREATE DATABASE big",
            "CREATE TABLE big.t (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(400), d DECIMAL(12,2))",
        )
        yield server
    finally:
        server.destroy()


def _load(server: MariaDBServer) -> None:
    server.execute("DROP TABLE IF EXISTS big.t",
                   "CREATE TABLE big.t (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(400), "
                   "d DECIMAL(12,2))",
                   f"INSERT INTO big.t SELECT seq, seq % 1000, RPAD(CONCAT('row ', seq, ' '), 300, 'abcdefghij'), "
                   f"(seq % 100000) / 100 FROM seq_1_to_{ROWS}", database="big")  # fmt: skip


def _snapshotted(spark: Any, server: MariaDBServer, tmp: Path, pipeline: str) -> tuple[StateStore, DeltaSink, Any]:
    """A fresh ``big.t`` snapshotted into Delta, its stream manifest written."""
    _load(server)
    store = StateStore(str(tmp / "state"), pipeline)
    sink = DeltaSink(str(tmp / "lake"))
    return store, sink, _snapshot(spark, server, store, sink)


def _snapshot(spark: Any, server: MariaDBServer, store: StateStore, sink: DeltaSink) -> Any:
    settings = server.cdc_settings()
    with settings.connect() as conn:
        plan = plan_snapshot(conn, [TABLE], 50_000, 4)
    store.write_plan("p1", plan.to_dict())
    for g in plan.groups:
        run_snapshot_group(spark, settings, store, "p1", g.group_id, sink)
    store.write_manifest(build_manifest(plan, store.read_all_results("p1")))
    return plan


def _launch(
    server: MariaDBServer, tmp: Path, pipeline: str, log_path: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start the stream job as the stream operator does; return once its run record says running."""
    run_id = uuid.uuid4().hex[:12]
    env = dict(os.environ, MYSQLCDC_SOURCE=json.dumps(server.cdc_settings().to_dict()), PYSPARK_PYTHON=sys.executable)
    cmd = [
        str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
        "--driver-memory", DRIVER_MEMORY,
        "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
        "--conf", "spark.driver.extraJavaOptions=-XX:+ExitOnOutOfMemoryError",
        "--jars", "/usr/share/java/mariadb-java-client.jar",
        str(REPO / "spark_jobs" / "stream.py"),
        "--state-root", str(tmp / "state"), "--pipeline-id", pipeline, "--sink-root", str(tmp / "lake"),
        "--trigger-seconds", "0.5", "--apply-memory-mb", str(APPLY_MEMORY_MB), "--scratch-dir", str(tmp / "scratch"),
        "--run-id", run_id, *extra,
    ]  # fmt: skip
    logf = open(log_path, "ab")
    proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    store = StateStore(str(tmp / "state"), pipeline)
    deadline = time.monotonic() + 180
    while (store.read_json(RUN) or {}).get("run_id") != run_id or store.read_json(RUN).get("state") != "running":
        assert proc.poll() is None, f"the stream job died at start:\n{log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the stream job did not start"
        time.sleep(0.3)
    return proc


def _stop(proc: subprocess.Popen[bytes], store: StateStore) -> None:
    """Stop as ``mysqlcdc stop`` does (after the running batch), then make sure the job is gone."""
    if proc.poll() is None:
        try:
            request_stop(store, timeout=120, force_after_timeout=False)
            proc.wait(timeout=60)
        except (TimeoutError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _head(server: MariaDBServer) -> Any:
    with server.cdc_settings().connect() as conn:
        return current_offset(conn)


def _assert_equal(server: MariaDBServer, plan: Any, sink: DeltaSink) -> None:
    with server.cdc_settings().connect() as conn:
        cmp = compare(conn, plan.tables[TABLE], sink.read(TABLE))
    assert cmp.match, cmp.first_difference
    assert cmp.sink_rows == cmp.source_rows


def _bounded_commits(sink: DeltaSink) -> list[dict[str, Any]]:
    out = []
    for h in DeltaTable(sink.table_uri(TABLE)).history():
        meta = h.get("mysqlcdc")
        if meta:
            rec = json.loads(meta) if isinstance(meta, str) else meta
            if rec.get("bounded_rewrite"):
                out.append(rec)
    return out


@pytest.mark.timeout(1200)
def test_stream_applies_huge_transactions_in_bounded_memory(big_server, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """UPDATE every row, DELETE half, INSERT 300,000 — one transaction each — then small ones; the
    table's changelog is on, so each huge batch also streams into it in one commit."""
    store, sink, plan = _snapshotted(spark, big_server, tmp_path, "big")
    store.write_manifest(store.read_manifest().with_changelogs({TABLE: True}))
    log_path = tmp_path / "stream.log"
    proc = _launch(big_server, tmp_path, "big", log_path)
    try:
        big_server.execute("UPDATE big.t SET v = v + 1, s = CONCAT('y', s)", database="big")
        big_server.execute("DELETE FROM big.t WHERE id % 2 = 0", database="big")
        big_server.execute(
            f"INSERT INTO big.t SELECT seq + 1000000, seq, RPAD(CONCAT('new ', seq), 300, 'xyz'), seq / 100 "
            f"FROM seq_1_to_{ROWS}", database="big",
        )  # fmt: skip
        wait_until_applied(store, _head(big_server), timeout=600)
        # the stream lives on and applies ordinary transactions after the huge ones
        for i in range(5):
            late = f"INSERT INTO big.t VALUES ({5_000_000 + i}, {i}, 'late', 1.5)"
            big_server.execute(f"UPDATE big.t SET v = -{i} WHERE id = {1 + 2 * i}", late, database="big")
        wait_until_applied(store, _head(big_server), timeout=300)
        assert proc.poll() is None, "the stream died"
        assert (store.read_json(RUN) or {}).get("state") == "running"
    finally:
        _stop(proc, store)
    text = log_path.read_text()
    assert "OutOfMemoryError" not in text
    assert "is large" in text  # the large batches said so in the log
    _assert_equal(big_server, plan, sink)
    bounded = _bounded_commits(sink)
    assert len(bounded) >= 3, bounded  # each huge transaction was one bounded-rewrite commit
    assert {(b["upserts"], b["deletes"]) for b in bounded} >= {(ROWS, 0), (0, ROWS // 2), (ROWS, 0)}
    status = store.read_json(STATUS)
    assert status["batch_id"] >= 3 and "current_batch" not in status
    changes = read_changelog(sink, TABLE)
    ops = changes.group_by("_op").aggregate([("_op", "count")]).to_pydict()
    assert dict(zip(ops["_op"], ops["_op_count"], strict=True)) == {"u": ROWS + 5, "d": ROWS // 2, "c": ROWS + 5}
    keys = changes.select(["_tx_id", "_event_pos", "_row_index"]).group_by(["_tx_id", "_event_pos", "_row_index"])
    assert keys.aggregate([]).num_rows == changes.num_rows  # each change once
    ordered = order_key(changes)  # the huge UPDATE came first: its rows lead the 'u' changes
    moved = ordered.filter(pc.equal(ordered.column("_op"), "u")).slice(0, 3).to_pylist()
    assert all(r["before"]["v"] + 1 == r["after"]["v"] and r["after"]["s"] == "y" + r["before"]["s"] for r in moved)


@pytest.mark.timeout(1200)
def test_driver_killed_while_applying_a_large_batch(big_server, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the stream's driver in the middle of a bounded apply; the restart is exact."""
    store, sink, plan = _snapshotted(spark, big_server, tmp_path, "kill")
    log_path = tmp_path / "stream.log"
    proc = _launch(big_server, tmp_path, "kill", log_path)
    try:
        big_server.execute("UPDATE big.t SET v = v * 3, s = CONCAT('k', s), d = d + 1", database="big")
        deadline = time.monotonic() + 300
        while True:  # kill once the driver is folding or rewriting the table
            cur = (store.read_json(STATUS) or {}).get("current_batch") or {}
            if cur.get("phase") in ("collecting", "folding", "matching", "rewriting"):
                break
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the large batch never reached its apply phases"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        _stop(proc, store)
    assert not _bounded_commits(sink)  # nothing of the batch is visible
    big_server.execute("UPDATE big.t SET v = 7 WHERE id < 100", database="big")
    proc = _launch(big_server, tmp_path, "kill", tmp_path / "stream2.log")
    try:
        wait_until_applied(store, _head(big_server), timeout=600)
    finally:
        _stop(proc, store)
    _assert_equal(big_server, plan, sink)
    assert len(_bounded_commits(sink)) == 1


@pytest.mark.timeout(1200)
def test_huge_transactions_inside_a_snapshot_window(big_server, spark, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """The same three transactions between a group's low and high watermark: its chunks equal the
    source as of its HW, the window folded in spilled buckets (``window_memory_mb`` 16)."""
    import logging

    from airflow_provider_mysqlcdc.snapshot.group import SnapshotOptions, SnapshotTestHooks

    caplog.set_level(logging.INFO, logger="airflow_provider_mysqlcdc.snapshot.binlog_window")
    _load(big_server)
    store = StateStore(str(tmp_path / "state"), "window")
    sink = DeltaSink(str(tmp_path / "lake"))
    settings = big_server.cdc_settings()
    with settings.connect() as conn:
        plan = plan_snapshot(conn, [TABLE], 50_000, 4)
    assert len(plan.groups) == 2
    store.write_plan("p1", plan.to_dict())

    def huge_transactions() -> None:
        big_server.execute("UPDATE big.t SET v = v + 5, s = CONCAT('w', s), d = d / 2", database="big")
        big_server.execute("DELETE FROM big.t WHERE id % 2 = 1", database="big")
        big_server.execute(
            f"INSERT INTO big.t SELECT seq + 2000000, seq, RPAD(CONCAT('win ', seq), 250, 'uv'), seq / 7 "
            f"FROM seq_1_to_{ROWS}", database="big",
        )  # fmt: skip

    # JDBC: the chunks take the group's window, so all of it is replayed (a native chunk's own
    # window ends before these transactions: the stream would apply them)
    opts = SnapshotOptions(window_memory_mb=16, scratch_dir=str(tmp_path / "scratch"), reader="jdbc")
    first = run_snapshot_group(spark, settings, store, "p1", plan.groups[0].group_id, sink, opts,
                               SnapshotTestHooks(before_high_watermark=huge_transactions))  # fmt: skip
    assert first.window_changes == ROWS + ROWS // 2 + ROWS
    assert "folded in" in caplog.text  # the window did not fit the budget: it was folded in buckets
    for g in plan.groups[1:]:
        run_snapshot_group(spark, settings, store, "p1", g.group_id, sink, opts)
    _assert_equal(big_server, plan, sink)  # nothing was written after the HW: chunks == source


@pytest.mark.timeout(1200)
def test_a_driver_out_of_memory_is_reported_with_its_batch(big_server, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The old failure, forced: everything collected on a 512m driver (max_inline_bytes ~4 GB). The
    JVM dies of OutOfMemoryError; the run record and the sensor name the batch and the setting to
    change instead of "Connection refused"; the default settings then apply the batch exactly."""
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_mysqlcdc.sensors.stream import MySqlCdcStreamSensor
    from airflow_provider_mysqlcdc.stream.launcher import launch_detached

    store, sink, plan = _snapshotted(spark, big_server, tmp_path, "oom")
    run_id = uuid.uuid4().hex[:12]
    env = dict(os.environ, MYSQLCDC_SOURCE=json.dumps(big_server.cdc_settings().to_dict()),
               PYSPARK_PYTHON=sys.executable)  # fmt: skip
    cmd = [
        str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", "--driver-memory", DRIVER_MEMORY,
        "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
        "--conf", "spark.driver.extraJavaOptions=-XX:+ExitOnOutOfMemoryError",
        "--jars", "/usr/share/java/mariadb-java-client.jar", str(REPO / "spark_jobs" / "stream.py"),
        "--state-root", str(tmp_path / "state"), "--pipeline-id", "oom", "--sink-root", str(tmp_path / "lake"),
        "--trigger-seconds", "0.5", "--run-id", run_id, "--max-inline-bytes", str(4_000_000_000),
    ]  # fmt: skip
    handle = launch_detached(store, cmd, env, run_id)  # as the stream operator launches a detached stream
    proc = handle.pop("_proc")
    try:
        deadline = time.monotonic() + 180
        while (store.read_json(RUN) or {}).get("state") != "running":
            assert proc.poll() is None and time.monotonic() < deadline, Path(handle["log_path"]).read_text()[-3000:]
            time.sleep(0.3)
        # three updates of every row in ONE transaction (~550 MiB of binlog, one batch): one update
        # alone (~185 MiB) fitted the 512m driver now and then on a slow machine, and the test then
        # waited in vain for the OutOfMemoryError
        big_server.execute("BEGIN", "UPDATE big.t SET v = v + 9, s = CONCAT('m', s)",
                           "UPDATE big.t SET v = v + 1, s = CONCAT('n', s)", "UPDATE big.t SET d = d + 1",
                           "COMMIT", database="big")  # fmt: skip
        deadline = time.monotonic() + 600
        while stream_state(store)["running"]:
            assert time.monotonic() < deadline, "the driver did not run out of memory"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # the heap (OutOfMemoryError) or Arrow's direct buffers (OutOfDirectMemoryError), whichever fills first
    assert re.search(r"OutOf(Direct)?Memory(Error|Exception)", Path(handle["log_path"]).read_text())
    reason = stream_state(store)["reason"]
    assert "Spark driver JVM went away in batch" in reason, reason
    assert "MiB of binlog" in reason and "driver_memory" in reason and "max_inline_bytes" in reason, reason
    assert "Connection refused" not in reason.split("(")[0]
    sensor = MySqlCdcStreamSensor(task_id="wait", pipeline_id="oom", state_root=str(tmp_path / "state"),
                                  condition="lag", max_lag_seconds=5, deferrable=False)  # fmt: skip
    with pytest.raises(AirflowException, match="Spark driver JVM went away in batch"):
        sensor.poke({})
    proc = _launch(big_server, tmp_path, "oom", tmp_path / "stream2.log")  # the defaults: the batch is staged
    try:
        wait_until_applied(store, _head(big_server), timeout=600)
    finally:
        _stop(proc, store)
    _assert_equal(big_server, plan, sink)
