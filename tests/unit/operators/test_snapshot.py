"""MySqlCdcSnapshotOperator without Spark: its spark-submit command, templates, the plan's config, lineage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.records import ChunkResult, GroupReport
from airflow_provider_mysqlcdc.operators import MySqlCdcSnapshotOperator
from airflow_provider_mysqlcdc.operators._lineage import delta_dataset, lineage_names
from airflow_provider_mysqlcdc.operators._spark import job_path
from airflow_provider_mysqlcdc.state import StateStore
from tests.support import fake_openlineage, fake_spark

TABLE = "shop.orders"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateStore:
    fake_spark.install(tmp_path, monkeypatch)
    fake_spark.connections(monkeypatch)
    monkeypatch.setenv("FAKE_SPARK_RECORD", str(tmp_path / "commands.jsonl"))
    return StateStore(str(tmp_path / "state"), "shop")


def _plan(store: StateStore, skip_backfill: bool = False) -> None:
    store.write_plan("p1", {"tables": {}, "groups": [], "skip_backfill": skip_backfill,
                            "pipeline": {"skip_backfill": skip_backfill}})  # fmt: skip


def _report(store: StateStore) -> None:
    """What the snapshot job leaves in the state store when it succeeds."""
    hw = BinlogOffset("mysql-bin.000003", 120)
    chunks = [ChunkResult(TABLE, i, 0, BinlogOffset("mysql-bin.000003", 4), hw, 500, 0.5) for i in range(2)]
    store.write_group_report("p1", GroupReport(0, chunks, {"seconds": 2.0}))


def _op(store: StateStore, **kwargs: Any) -> MySqlCdcSnapshotOperator:
    descriptor = {"pipeline_id": "shop", "state_root": store.state_root, "sink_root": "s3://lake/cdc", "plan_id": "p1",
                  "group_id": 0, "group_label": f"{TABLE} chunks 0–1"}  # fmt: skip
    return MySqlCdcSnapshotOperator(task_id="snapshot", jars="/opt/jdbc.jar", **{**descriptor, **kwargs})


def _commands(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "commands.jsonl").read_text().splitlines()]


def test_it_is_a_spark_submit_operator_with_the_parents_template_fields() -> None:
    assert issubclass(MySqlCdcSnapshotOperator, SparkSubmitOperator)
    fields = MySqlCdcSnapshotOperator.template_fields
    assert set(SparkSubmitOperator.template_fields) <= set(fields)
    assert {"pipeline_id", "state_root", "sink_root", "plan_id", "group_id", "reader"} <= set(fields)
    assert "skip_backfill" not in fields  # the plan has it


def test_template_rendering(store: StateStore) -> None:
    op = _op(store, pipeline_id="{{ params.pipeline }}", conf={"spark.app.tag": "{{ params.pipeline }}"},
             name="cdc-{{ params.pipeline }}", reader="{{ params.reader }}")  # fmt: skip
    op.render_template_fields({"params": {"pipeline": "shop", "reader": "jdbc"}})
    assert op.pipeline_id == "shop" and op.conf == {"spark.app.tag": "shop"} and op.reader == "jdbc"
    assert op.name == "cdc-shop"  # a parent's template field


@pytest.mark.parametrize("skip_backfill", [False, True])
def test_the_command_and_the_summary(store: StateStore, tmp_path: Path, skip_backfill: bool) -> None:
    _plan(store, skip_backfill)
    _report(store)
    op = _op(store, conf={"spark.executor.instances": "2"}, executor_memory="1g", fetch_size=500, reader="native")
    summary = op.execute({"run_id": "manual__1"})
    (cmd,) = _commands(tmp_path)
    app = cmd.index(job_path("snapshot"))
    assert cmd[app + 1 :] == [
        "--state-root", store.state_root, "--pipeline-id", "shop", "--plan-id", "p1", "--group-id", "0",
        "--sink-root", "s3://lake/cdc", "--fetch-size", "500", "--reader", "native", "--window-memory-mb", "512",
        *(["--skip-backfill"] if skip_backfill else []),
    ]  # fmt: skip
    head = cmd[:app]
    assert head[head.index("--name") + 1] == "mysqlcdc-snapshot-shop-g0"
    assert "spark.executor.instances=2" in head and head[head.index("--executor-memory") + 1] == "1g"
    assert summary["chunks"] == 2 and summary["rows"] == 1000 and summary["tables"] == [TABLE]
    assert summary["rows_per_s"] == 500.0 and summary["max_hw"] == {"file": "mysql-bin.000003", "pos": 120}


def test_the_jobs_own_error_explains_a_failure(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowException

    _plan(store)
    store.write_group_error("p1", 0, "chunk key not unique")
    monkeypatch.setenv("FAKE_SPARK_EXIT", "1")
    # the operator clears an earlier attempt's error, then the failing job writes its own: keep it
    monkeypatch.setattr(StateStore, "clear_group_error", lambda self, plan_id, group_id: None)
    with pytest.raises(AirflowException, match=r"snapshot group 0 \(shop.orders chunks 0–1\) failed: chunk key"):
        _op(store).execute({})


def test_a_bad_reader_fails_before_spark(store: StateStore) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="reader must be"):
        _op(store, reader="odbc").execute({})


def test_lineage_names() -> None:
    inputs, outputs = lineage_names("db.example", 3307, "s3://bucket/lake/", ["shop.b", "shop.a", "shop.a"])
    assert inputs == [("mysql://db.example:3307", "shop.a"), ("mysql://db.example:3307", "shop.b")]
    assert outputs == [("s3://bucket", "lake/shop/a"), ("s3://bucket", "lake/shop/b")]
    assert delta_dataset("/data/lake", "db.t") == ("file", "/data/lake/db/t")
    assert delta_dataset("file:///data/lake", "db.t") == ("file", "/data/lake/db/t")
    assert delta_dataset("abfss://c@acct.dfs.core.windows.net/lake", "db.t") == (
        "abfss://c@acct.dfs.core.windows.net", "lake/db/t"
    )


def test_openlineage_facets(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _plan(store)
    _report(store)
    op = _op(store)
    assert op.get_openlineage_facets_on_complete(None) is None  # before it ran: nothing read or written
    op.execute({})
    if not fake_openlineage.installed():
        assert op.get_openlineage_facets_on_complete(None) is None  # no provider: no lineage, no error
        fake_openlineage.install(monkeypatch)
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("mysql://db.example:3307", TABLE)]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("s3://lake", "cdc/shop/orders")]


def test_spark_conn_id_is_a_deprecated_name_of_conn_id(store: StateStore) -> None:
    with pytest.warns(DeprecationWarning, match="conn_id"):
        op = _op(store, spark_conn_id="spark_cluster")
    assert op._conn_id == "spark_cluster"
    assert _op(store, conn_id="spark_other")._conn_id == "spark_other"
