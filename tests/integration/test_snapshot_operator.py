"""MySqlCdcSnapshotOperator through the Spark provider: on_kill stops the job, a retry is exact."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.pipeline import plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from tests.support.background import BackgroundCall


def test_on_kill_stops_the_spark_job_and_a_retry_is_exact(  # type: ignore[no-untyped-def]
    mariadb, db, cdc_settings, airflow_conn_env, tmp_path, monkeypatch
) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_mysqlcdc.operators import MySqlCdcSnapshotOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    mariadb.execute(
        f"CREATE TABLE `{db}`.t (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(60) NOT NULL)",
        f"INSERT INTO `{db}`.t SELECT seq, REPEAT('v', 50) FROM seq_1_to_200000",
        database=db,
    )
    table = f"{db}.t"
    store, sink = StateStore(str(tmp_path / "state"), "op"), DeltaSink(str(tmp_path / "lake"))
    config = PipelineConfig.from_params(
        pipeline_id="op", sink_root=sink.root, state_root=store.state_root, tables=[table], chunk_size=20_000,
        chunks_per_task=64,
    )
    with cdc_settings.connect() as conn:
        outcome = plan_run(conn, store, config, "p1", sink.exists)
    assert len(outcome.groups) == 1
    g = outcome.groups[0]

    def operator() -> Any:
        return MySqlCdcSnapshotOperator(
            task_id="snapshot", pipeline_id="op", sink_root=sink.root, state_root=store.state_root, **g
        )

    op = operator()
    th = BackgroundCall(lambda: op.execute({"run_id": "manual__x"}))
    th.start()
    deadline = time.monotonic() + 60
    while (op._hook is None or op._hook._submit_sp is None) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(4.0)  # spark-submit is up and working
    proc = op._hook._submit_sp
    op.on_kill()
    th.join(timeout=60)
    assert not th.is_alive()
    assert isinstance(th.error, AirflowException), (th.error, th.result)
    assert proc.poll() is not None  # the Spark job is gone
    assert store.read_group_report("p1", 0) is None

    summary = operator().execute({"run_id": "manual__x"})  # the retry
    assert summary["group_id"] == 0 and summary["chunks"] == 10 and summary["rows"] == 200_000
    assert summary["tables"] == [table] and summary["min_hw"] == summary["max_hw"]
    assert summary["group_label"] == g["group_label"] == "group 0: 1 table, 10 chunks"
    assert g["group_chunks"] == f"{table} chunks 0–9"
    ids = sink.read(table).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 200_000


@pytest.mark.parametrize("missing", ["spark"])
def test_missing_spark_connection_names_the_fix(  # type: ignore[no-untyped-def]
    missing, airflow_conn_env, tmp_path, monkeypatch
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_mysqlcdc.operators import MySqlCdcSnapshotOperator

    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    store = StateStore(str(tmp_path / "state"), "op")
    store.write_plan("p1", {"tables": {}, "groups": [], "skip_backfill": False})
    op = MySqlCdcSnapshotOperator(
        task_id="snapshot", pipeline_id="op", sink_root=str(tmp_path / "lake"), state_root=store.state_root,
        plan_id="p1", group_id=0,
    )
    with pytest.raises(AirflowFailException, match="AIRFLOW_CONN_SPARK_DEFAULT"):
        op.execute({"run_id": "manual__x"})
