"""``recover_purged`` on a REAL pipeline whose stream's restart offset was purged from the source.

A stream is stopped, the writer goes on, and the binlog is purged past the stream's checkpoint.
The next plan must refuse to go on silently and name the param; with ``recover_purged`` every
captured table is re-snapshotted under the writer, the stream restarts as a new generation from
those snapshots, and every table equals its source row for row.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.pipeline import PipelineStateError, finalize_run, plan_run
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import checkpoint_offset, request_stop, wait_until_applied
from tests.support.mariadb import MariaDBServer
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.stream_thread import StreamThread, streaming_pipeline
from tests.support.verify import compare

pytestmark = pytest.mark.integration

ROWS = 4_000
PIPELINE = "rcv"


def _stop(stream: StreamThread, store: StateStore) -> None:
    request_stop(store, timeout=60)
    stream.stop_event.set()
    stream.join(timeout=120)


@pytest.mark.timeout(900)
def test_a_purged_restart_offset_is_refused_then_recovered_by_resnapshotting_everything(  # type: ignore[no-untyped-def]
    private_server: MariaDBServer, spark, tmp_path: Path
) -> None:
    server, db = private_server, "rcv_db"
    server.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    settings = server.cdc_settings()
    tables = make_tables(server, db, rows=ROWS)
    store, sink, stream = streaming_pipeline(spark, settings, tmp_path, PIPELINE, tables, 1_000, "rcv-1")
    writer = RandomWriter(server, db, rows=ROWS, seed=21)
    writer.start()
    try:
        assert stream.error is None and stream.is_alive(), stream.error
        time.sleep(2)
        with settings.connect() as conn:
            wait_until_applied(store, current_offset(conn), timeout=120)
        _stop(stream, store)
        stopped_at = checkpoint_offset(store)
        assert stopped_at is not None
        time.sleep(1)  # the writer goes on: these changes will be lost with the purged files
        server.flush_binary_logs(2)
        server.purge_binary_logs_to(server.query("SHOW MASTER STATUS")[0][0])

        config = dict(pipeline_id=PIPELINE, sink_root=str(tmp_path / "lake"), state_root=str(tmp_path / "state"),
                      tables=tables, chunk_size=1_000)  # fmt: skip
        with settings.connect() as conn, pytest.raises(PipelineStateError) as refused:
            plan_run(conn, store, PipelineConfig.from_params(**config), "p1", sink.exists, table_owner=sink.owner_of)
        assert f"{stopped_at.file}" in str(refused.value) and "recover_purged=true" in str(refused.value)

        with settings.connect() as conn:
            outcome = plan_run(conn, store, PipelineConfig.from_params(**config, recover_purged=True), "p2",
                               sink.exists, table_owner=sink.owner_of)  # fmt: skip
        assert sorted(outcome.resnapshot_tables) == sorted(tables) and outcome.groups
        for g in outcome.groups:
            run_snapshot_group(spark, settings, store, "p2", g["group_id"], sink)
        result = finalize_run(store, sink, "p2")
        assert result.new_generation == 1 and sorted(result.resnapshotted) == sorted(tables), result
        assert checkpoint_offset(store) is None  # the new generation has no checkpoint yet

        stream = StreamThread(spark, settings, store, sink, run_id="rcv-2").start_running()
        assert stream.error is None, stream.error
        time.sleep(3)  # the writer keeps going while the recovered stream runs
        writer.stop_event.set()
        writer.join()
        with settings.connect() as conn:
            wait_until_applied(store, current_offset(conn), timeout=180)
        with settings.connect() as conn:
            for t in tables:
                cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
                assert cmp.match, f"{t}: {cmp}"
        assert writer.transactions > 300
    finally:
        writer.stop_event.set()
        _stop(stream, store)
        server.execute(f"DROP DATABASE IF EXISTS {db}")


def test_the_recover_flag_needs_a_snapshotting_mode() -> None:
    from airflow_provider_mysqlcdc.core.config import PipelineConfigError

    with pytest.raises(PipelineConfigError, match=r"recover_purged needs startup_mode 'initial'"):
        PipelineConfig.from_params(pipeline_id="p", sink_root="/l", state_root="/s", tables=["a.b"],
                                   recover_purged=True, startup_mode="latest-offset")  # fmt: skip
    assert PipelineConfig.from_params(pipeline_id="p", sink_root="/l", state_root="/s", tables=["a.b"],
                                      recover_purged="true").recover_purged  # fmt: skip
