"""MySqlCdcStreamOperator without Spark or MariaDB: the plan's config, its command, the detached launch, lineage.

The manifest hand-over (``pipeline.finalize_run``) and the source's binlog check have tests of their
own; here they are stubbed so the operator's own part runs in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_mysqlcdc.core.manifest import Generation
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.operators import MySqlCdcStreamOperator
from airflow_provider_mysqlcdc.operators._spark import job_path
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import HANDLE
from tests.support import fake_openlineage, fake_spark

TABLES = ["shop.orders", "shop.customers"]
START = BinlogOffset("mysql-bin.000007", 4)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateStore:
    import airflow_provider_mysqlcdc.pipeline as pipeline
    from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook

    fake_spark.install(tmp_path, monkeypatch)
    fake_spark.connections(monkeypatch)
    monkeypatch.setenv("FAKE_SPARK_RECORD", str(tmp_path / "commands.jsonl"))
    outcome = SimpleNamespace(reloaded=False, added=TABLES, resnapshotted=[], new_generation=None,
                              to_dict=lambda: {"added": TABLES})  # fmt: skip
    monkeypatch.setattr(pipeline, "finalize_run", lambda *a, **k: outcome)
    manifest = SimpleNamespace(tables=dict.fromkeys(TABLES), start_offset=START, generation=Generation())
    monkeypatch.setattr(StateStore, "read_manifest", lambda self: manifest)
    monkeypatch.setattr(MySqlCdcHook, "ensure_offset_available", lambda self, offset: None)
    return StateStore(str(tmp_path / "state"), "shop")


def _plan(store: StateStore, startup_mode: str = "initial", sink_root: str = "/data/lake") -> None:
    store.write_plan("p1", {"pipeline": {"startup_mode": startup_mode, "sink_root": sink_root}, "groups": []})


def _op(store: StateStore, **kwargs: Any) -> MySqlCdcStreamOperator:
    return MySqlCdcStreamOperator(
        task_id="stream", pipeline_id="shop", state_root=store.state_root, plan_id="p1", jars="", **kwargs
    )


def test_it_is_a_spark_submit_operator_with_the_parents_template_fields() -> None:
    assert issubclass(MySqlCdcStreamOperator, SparkSubmitOperator)
    fields = MySqlCdcStreamOperator.template_fields
    assert set(SparkSubmitOperator.template_fields) <= set(fields)
    assert {"pipeline_id", "state_root", "sink_root", "plan_id", "snapshot_summaries", "stream_mode"} <= set(fields)
    assert "startup_mode" not in fields  # the plan has it
    assert _op(StateStore("/tmp/x", "shop")).trigger_rule == "none_failed"


def test_template_rendering(store: StateStore) -> None:
    op = _op(store, stream_mode="{{ params.mode }}", proxy_user="{{ params.user }}",
             snapshot_summaries="{{ params.summaries }}")  # fmt: skip
    op.render_template_fields({"params": {"mode": "attached", "user": "etl", "summaries": "[]"}})
    assert (op.stream_mode, op.proxy_user, op.snapshot_summaries) == ("attached", "etl", "[]")


def test_stream_args() -> None:
    op = MySqlCdcStreamOperator(
        task_id="stream", pipeline_id="shop", state_root="/s", sink_root="/l", readers=4,
        max_bytes_per_trigger=1 << 20, apply_memory_mb=256, apply_threads=2, apply_processes=0,
        maintenance_interval_seconds=0,
        vacuum_retention_hours=2,
    )  # fmt: skip
    assert op.stream_args("r1") == [
        "--state-root", "/s", "--pipeline-id", "shop", "--sink-root", "/l", "--run-id", "r1", "--trigger-seconds",
        "1.0", "--readers", "4", "--max-bytes-per-trigger", "1048576", "--apply-memory-mb", "256",
        "--apply-threads", "2", "--apply-processes", "0", "--maintenance-interval", "0.0",
        "--vacuum-retention-hours", "2.0",
    ]  # fmt: skip
    evolve = MySqlCdcStreamOperator(task_id="s", pipeline_id="shop", state_root="/s", sink_root="/l",
                                    schema_change_policy="evolve")  # fmt: skip
    assert evolve.stream_args("r1")[-2:] == ["--schema-change-policy", "evolve"]
    merge_only = MySqlCdcStreamOperator(task_id="s", pipeline_id="shop", state_root="/s", sink_root="/l",
                                        deletion_vectors=False)  # fmt: skip
    assert merge_only.stream_args("r1")[-1] == "--no-deletion-vectors"
    assert "schema_change_policy" in MySqlCdcStreamOperator.template_fields
    with pytest.raises(ValueError, match="evolve, lenient, fail"):
        MySqlCdcStreamOperator(task_id="s", pipeline_id="shop", state_root="/s", sink_root="/l",
                               schema_change_policy="sometimes").stream_args("r1")  # fmt: skip


def test_small_table_settings_reach_the_job_and_bad_ones_are_refused_before_launch() -> None:
    def args(**kw: object) -> list[str]:
        return MySqlCdcStreamOperator(task_id="s", pipeline_id="shop", state_root="/s", sink_root="/l",
                                      **kw).stream_args("r1")  # fmt: skip

    assert "--rewrite-below-mb" not in args() and "--small-table-retention-seconds" not in args()
    # as the example DAG passes them: rendered params (a string without native rendering)
    assert args(rewrite_below_mb="4", small_table_retention_seconds=300)[-4:] == [
        "--rewrite-below-mb", "4", "--small-table-retention-seconds", "300.0"]  # fmt: skip
    assert args(rewrite_below_mb=0)[-2:] == ["--rewrite-below-mb", "0"]
    with pytest.raises(ValueError, match="small_table_retention_seconds must be a number of seconds"):
        args(small_table_retention_seconds="soon")
    with pytest.raises(ValueError, match="raise vacuum_retention_hours"):
        args(small_table_retention_seconds=7200)
    assert args(small_table_retention_seconds=7200, vacuum_retention_hours="2")[-2:] == [
        "--small-table-retention-seconds", "7200.0"]  # fmt: skip
    with pytest.raises(ValueError, match="rewrite_below_mb must be a whole number"):
        args(rewrite_below_mb="2.5")
    with pytest.raises(ValueError, match="raise apply_memory_mb"):
        args(rewrite_below_mb=600)
    for name in ("rewrite_below_mb", "small_table_retention_seconds", "vacuum_retention_hours"):
        assert name in MySqlCdcStreamOperator.template_fields


def test_detached_launch_returns_the_handle_once_the_stream_runs(store: StateStore, tmp_path: Path) -> None:
    _plan(store)
    op = _op(store, driver_memory="2g", conf={"spark.ui.enabled": "false"})
    result = op.execute({})
    assert result["launched"] and result["running"] and result["mode"] == "detached"
    assert result["master"] == "local[2]" and result["start_offset"] == START.to_dict()
    assert store.read_json(HANDLE)["run_id"] == result["run_id"]
    out = Path(result["log_path"]).read_text()  # the fake's output: in the driver log, not the task's
    assert json.loads(fake_spark.printed(out, "SOURCE"))["host"] == "db.example"
    (cmd,) = [json.loads(line) for line in (tmp_path / "commands.jsonl").read_text().splitlines()]
    app = cmd.index(job_path("stream"))
    assert cmd[app + 1 : app + 9] == ["--state-root", store.state_root, "--pipeline-id", "shop",
                                      "--sink-root", "/data/lake", "--run-id", result["run_id"]]  # fmt: skip
    head = cmd[:app]
    assert head[head.index("--driver-memory") + 1] == "2g" and "spark.ui.enabled=false" in head
    assert head[head.index("--name") + 1] == "mysqlcdc-stream-shop"


def test_snapshot_only_comes_from_the_plan(store: StateStore, tmp_path: Path) -> None:
    _plan(store, startup_mode="snapshot-only")
    result = _op(store).execute({})
    assert result["launched"] is False and "run_id" not in result
    assert not (tmp_path / "commands.jsonl").exists()  # no Spark job


def test_a_sink_root_other_than_the_plans_is_refused(store: StateStore) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    _plan(store)
    with pytest.raises(AirflowFailException, match="not the plan's"):
        _op(store, sink_root="/elsewhere").execute({})
    assert _op(store, sink_root="/data/lake/")._pipeline_config(store, "p1") == "initial"


def test_readers_default_to_the_plans_stream_readers_and_may_not_exceed_them(store: StateStore) -> None:
    """The plan reserved the first stream_readers server_ids for the stream (core/server_ids.py)."""
    from airflow.sdk.exceptions import AirflowFailException

    store.write_plan("p1", {"pipeline": {"startup_mode": "initial", "sink_root": "/l", "stream_readers": 6},
                            "groups": []})  # fmt: skip
    op = _op(store)
    op._pipeline_config(store, "p1")
    assert op.readers == 6 and op.stream_args("r")[-2:] == ["--readers", "6"]
    op = _op(store, readers=4)
    op._pipeline_config(store, "p1")
    assert op.readers == 4
    with pytest.raises(AirflowFailException, match="readers=7 exceeds the plan's stream_readers=6"):
        _op(store, readers=7)._pipeline_config(store, "p1")


def test_on_kill_leaves_a_detached_stream_running(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_provider_mysqlcdc.stream.control as control

    stops: list[Any] = []
    monkeypatch.setattr(control, "request_stop", lambda *a, **k: stops.append(a))
    op = _op(store)
    op._store = store
    op.on_kill()
    assert stops == []
    attached = _op(store, stream_mode="attached")
    attached._store = store
    attached.on_kill()  # no spark-submit started yet: only the graceful stop
    assert len(stops) == 1


def test_openlineage_facets(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _plan(store, sink_root="gs://bucket/lake")
    op = _op(store)
    op.execute({})
    if not fake_openlineage.installed():
        assert op.get_openlineage_facets_on_complete(None) is None
        fake_openlineage.install(monkeypatch)
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [
        ("mysql://db.example:3307", "shop.customers"), ("mysql://db.example:3307", "shop.orders"),
    ]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [
        ("gs://bucket", "lake/shop/customers"), ("gs://bucket", "lake/shop/orders"),
    ]
