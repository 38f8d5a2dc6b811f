"""The first task of each example DAG refuses a run conf key that is not a param, before any work."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG, Param
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_mysqlcdc.operators import MySqlCdcPlanOperator, MySqlCdcStopStreamOperator


def _plan(tmp_path: Path, **kwargs: object) -> MySqlCdcPlanOperator:
    with DAG("cdc", schedule=None, params={"tables": Param(["shop.orders"]), "verify": Param(False)}):
        return MySqlCdcPlanOperator(task_id="plan", pipeline_id="shop", sink_root=str(tmp_path / "lake"),
                                    state_root=str(tmp_path / "state"), tables=["shop.orders"],
                                    mysql_cdc_conn_id="no_such_connection", **kwargs)  # fmt: skip


def test_the_plan_refuses_a_typo_before_touching_anything(tmp_path: Path) -> None:
    op = _plan(tmp_path)
    with pytest.raises(AirflowFailException) as exc:
        op.execute({"run_id": "manual__1", "dag_run": SimpleNamespace(conf={"tabels": ["shop.coupons"]})})
    msg = str(exc.value)
    assert "'tabels' (did you mean 'tables'?)" in msg and "of DAG cdc" in msg and "tables, verify" in msg
    assert not (tmp_path / "state").exists()  # refused before the state store or the source


def test_the_check_can_be_switched_off(tmp_path: Path) -> None:
    """A DAG whose own tasks read more conf keys: the plan goes on (and here fails on the connection)."""
    op = _plan(tmp_path, refuse_unknown_conf=False)
    with pytest.raises(Exception) as exc:
        op.execute({"run_id": "manual__1", "dag_run": SimpleNamespace(conf={"my_key": 1})})
    assert "no_such_connection" in str(exc.value) and "my_key" not in str(exc.value)


def test_the_stop_operator_refuses_a_typo(tmp_path: Path) -> None:
    with DAG("cdc_stop", schedule=None, params={"pipeline_id": Param("shop"), "state_root": Param("/x")}):
        op = MySqlCdcStopStreamOperator(task_id="stop", pipeline_id="shop", state_root=str(tmp_path / "state"))
    with pytest.raises(AirflowFailException, match="'pipeline' \\(did you mean 'pipeline_id'\\?\\)"):
        op.execute({"dag_run": SimpleNamespace(conf={"pipeline": "orders"})})


def test_the_stop_operator_refuses_an_unknown_pipeline(tmp_path: Path) -> None:
    """A typo'd pipeline id read as "was not running": the stop DAG succeeded and nothing stopped."""
    from airflow_provider_mysqlcdc.core.stream_state import RunRecord
    from airflow_provider_mysqlcdc.state import StateStore

    StateStore(str(tmp_path), "shop").write_run(RunRecord(run_id="r1", state="stopped"))
    op = MySqlCdcStopStreamOperator(task_id="stop", pipeline_id="shpo", state_root=str(tmp_path))
    with pytest.raises(AirflowFailException) as exc:
        op.execute({})
    assert str(exc.value).startswith(f"no pipeline 'shpo' under state root {tmp_path} (did you mean 'shop'?)")
    out = MySqlCdcStopStreamOperator(task_id="stop", pipeline_id="shop", state_root=str(tmp_path)).execute({})
    assert out["stopped"] is False  # a known pipeline whose stream is not running: not an error
