"""Changelog tables and metadata columns on a REAL pipeline: every change exactly once, through a kill -9.

Three tables (BIGINT key with key moves, composite key, case-insensitive VARCHAR key) are planned
with ``changelog_tables`` and ``metadata_columns``, snapshotted (by each reader) while a random
writer runs, and streamed by the stream's ``spark-submit`` job, which is killed (-9) after a few
batches and restarted from its checkpoint; then a batch whose Delta commits were made is made to
run again (its checkpoint commit marker removed, as a crash between the two would leave it).
Then, per table:

* the changelog's changes (ops c/u/d) equal, in binlog order and exactly once, an independent read
  of the same binlog range (python-mysql-replication's own decoding, not the stream's) passed
  through the handoff rule — so its metadata columns equal the binlog positions;
* the snapshot rows (op r) sit at their group's high watermark;
* the SCD type 2 view's current rows equal the source row for row, and so does the mirror;
* every mirror row's metadata columns are those of its current version in the changelog, and
  ``verify`` passes (it compares the source's columns only).
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

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from airflow_provider_mysqlcdc.core.changelog import order_key
from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import changelog_uri, read_changelog
from airflow_provider_mysqlcdc.snapshot.group import SnapshotOptions, run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import request_stop, wait_until_applied
from airflow_provider_mysqlcdc.verify import verify_pipeline
from tests.support.binlog_changes import binlog_changes
from tests.support.changelog_checks import assert_changes_are_the_binlog_s, assert_history_is_the_source
from tests.support.mariadb import MariaDBServer
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.stream_thread import StreamThread

pytestmark = pytest.mark.integration

ROWS = 3_000
REPO = Path(__file__).resolve().parents[2]
KEYS = {"t_int": ["id"], "t_comp": ["region", "n"], "t_ci": ["k"]}


def _image(row: dict[str, Any] | None, table: str) -> tuple[Any, ...] | None:
    if row is None:
        return None
    return (*(row[c] for c in KEYS[table]), row["v"])


def _last_commit(tmp_path: Path) -> int:
    """The last micro-batch Spark marked committed in the stream's checkpoint (-1: none yet)."""
    dirs = [p for p in (tmp_path / "state").rglob("commits") if p.is_dir()]
    return max((int(p.name) for d in dirs for p in d.iterdir() if p.name.isdigit()), default=-1)


def _launch_stream(settings: Any, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, MYSQLCDC_SOURCE=json.dumps(settings.to_dict()), PYSPARK_PYTHON=sys.executable)
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
           "--conf", "spark.ui.enabled=false", "--jars", "/usr/share/java/mariadb-java-client.jar",
           str(REPO / "spark_jobs" / "stream.py"),
           "--state-root", str(tmp_path / "state"), "--pipeline-id", "clog", "--sink-root", str(tmp_path / "lake"),
           "--trigger-seconds", "0.5", "--max-events-per-trigger", "300"]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("reader", ["native", "jdbc"])
def test_changelog_holds_every_change_exactly_once_through_a_crash(  # type: ignore[no-untyped-def]
    mariadb: MariaDBServer, db: str, cdc_settings, spark, tmp_path: Path, reader: str
) -> None:
    tables = make_tables(mariadb, db, rows=ROWS)
    store = StateStore(str(tmp_path / "state"), "clog")
    sink = DeltaSink(str(tmp_path / "lake"), owner="clog")
    config = PipelineConfig.from_params(pipeline_id="clog", sink_root=str(tmp_path / "lake"),
                                        state_root=str(tmp_path / "state"), tables=[f"{db}.*"], chunk_size=300,
                                        chunks_per_task=4, changelog_tables=[f"{db}.t_*"],
                                        metadata_columns=True)  # fmt: skip
    writer = RandomWriter(mariadb, db, rate=120, seed=21, rows=ROWS)
    writer.start()
    proc = None
    try:
        with cdc_settings.connect() as conn:
            outcome = plan_run(conn, store, config, "p1", sink.exists, table_owner=sink.owner_of)
        highs = {}
        for g in outcome.groups:
            opts = SnapshotOptions(reader=reader)
            res = run_snapshot_group(spark, cdc_settings, store, "p1", g["group_id"], sink, opts)
            highs[g["group_id"]] = res.high_watermark
        finalize_run(store, sink, "p1")
        manifest = store.read_manifest()
        assert all(manifest.tables[t].changelog for t in tables), "changelog_tables selects every table"

        proc = _launch_stream(cdc_settings, tmp_path)
        deadline = time.monotonic() + 240
        while (store.read_json("stream/status.json") or {}).get("batch_id", -1) < 3:
            assert proc.poll() is None, "the stream job died on its own"
            assert time.monotonic() < deadline, "the stream never committed a batch"
            time.sleep(0.2)
        time.sleep(0.7)
        os.killpg(proc.pid, signal.SIGKILL)  # mid-batch: Delta commits may be ahead of the checkpoint
        proc.wait()
        time.sleep(2)  # the writer goes on while the stream is down
        in_flight = (store.read_json("stream/status.json") or {}).get("batch_id", -1)  # in Delta, maybe not committed
        stream = StreamThread(spark, cdc_settings, store, sink, "clog-restart").start_running()
        # let the restarted stream pass the batch the kill interrupted (on a slow machine it may not have
        # started a batch in a fixed few seconds; stopped before it, Delta would be a batch ahead of
        # Spark's commits and the replay below would not be the one this test makes)
        deadline = time.monotonic() + 240
        while _last_commit(tmp_path) < in_flight:
            assert stream.error is None and stream.is_alive(), stream.error
            assert time.monotonic() < deadline, f"the restarted stream never committed batch {in_flight}"
            time.sleep(0.2)
        # A crash right after a batch's Delta commits and before Spark marks it committed, made
        # certain: stop at a batch boundary and drop the last commit marker, so the batch runs again.
        request_stop(store, timeout=120)
        stream.stop_event.set()
        stream.join(timeout=120)
        commits = next(p for p in (tmp_path / "state").rglob("commits") if p.is_dir())
        last = _last_commit(tmp_path)
        app_id = manifest.app_id("clog")
        logged = [DeltaTable(changelog_uri(sink, t)).transaction_version(app_id) for t in tables]
        # The batch to replay is the newest one in a changelog (a table the writer has not touched in
        # any batch yet records no batch: None). It is `last`, or `last + 1` when the stop interrupted
        # the next batch after a Delta commit and before Spark marked it committed — by design (see
        # stream.job.stop_gracefully), and already the crash this test makes.
        ahead = max(v for v in logged if v is not None)
        assert ahead in (last, last + 1), (last, logged)
        for d, first in ((commits, ahead), (commits.parent / "offsets", ahead + 1)):  # a planned next batch never ran
            for n in [int(p.name) for p in d.iterdir() if p.name.isdigit() and int(p.name) >= first]:
                (d / str(n)).unlink()
                (d / f".{n}.crc").unlink(missing_ok=True)
        stream = StreamThread(spark, cdc_settings, store, sink, "clog-replay").start_running()
        time.sleep(3)
        writer.stop_event.set()
        writer.join()
        with cdc_settings.connect() as conn:
            end = current_offset(conn)
        wait_until_applied(store, end, timeout=240)
        request_stop(store, timeout=120)
        stream.stop_event.set()
        stream.join(timeout=120)
        assert stream.error is None, stream.error
    finally:
        writer.stop_event.set()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    flt = manifest.handoff_filter()
    independent = binlog_changes(mariadb, db, manifest.start_offset, end)
    with cdc_settings.connect() as conn:
        for t in tables:
            name = t.split(".")[1]
            schema = read_table_schema(conn, TableId.parse(t))
            log = order_key(read_changelog(sink, t))
            changes = log.filter(pc.not_equal(log.column("_op"), "r"))
            snap = log.filter(pc.equal(log.column("_op"), "r"))

            # snapshot rows: at their group's HW, one per row of each group
            assert snap.num_rows >= ROWS * 0.9, snap.num_rows
            hw_of = {f"snapshot:p1:{g}": hw for g, hw in highs.items()}
            for r in snap.select(["_tx_id", "_binlog_file", "_binlog_pos"]).to_pylist():
                assert BinlogOffset(r["_binlog_file"], r["_binlog_pos"]) == hw_of[r["_tx_id"]], r

            # changes: exactly the admitted independent changes, in binlog order, each once
            assert_changes_are_the_binlog_s(t, changes, independent, flt, manifest.tables[t].chunk_key_columns,
                                            lambda row, name=name: _image(row, name))  # fmt: skip
            # the SCD2 view's current rows and the mirror equal the source; the mirror's metadata
            # columns are the event that last wrote each row, as its changelog says (its changes
            # were checked against the binlog above, its snapshot rows against the HWs)
            mirror = assert_history_is_the_source(conn, sink, t, schema, manifest.tables[t].merge_key)
            ops = set(mirror.column("_op").to_pylist())
            assert ops <= {"r", "c", "u"} and {"r", "u"} <= ops, ops
    # verify compares the source columns only: the metadata columns do not make it fail
    report = verify_pipeline(cdc_settings, store, sink, wait_timeout=120)
    assert report.ok, report.to_dict()
