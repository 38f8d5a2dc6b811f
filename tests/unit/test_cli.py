"""The CLI's pipeline commands without a server: the DAG's environment variables as defaults, and an
unknown pipeline refused with what the state root holds (issue 33 item 8: it printed a JSON of nulls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.cli import build_parser, main
from airflow_provider_mysqlcdc.core.stream_state import RunRecord
from airflow_provider_mysqlcdc.state import StateStore

ENV = ("MYSQLCDC_STATE_ROOT", "MYSQLCDC_SINK_ROOT", "MYSQLCDC_STORAGE_CONN_ID", "MYSQLCDC_TABLES")


@pytest.fixture(autouse=True)
def _no_dag_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def test_the_dags_environment_variables_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MYSQLCDC_STATE_ROOT", "s3://lake/state")
    monkeypatch.setenv("MYSQLCDC_SINK_ROOT", "s3://lake/tables")
    monkeypatch.setenv("MYSQLCDC_STORAGE_CONN_ID", "aws_lake")
    monkeypatch.setenv("MYSQLCDC_TABLES", "shop.orders,shop.items")
    status = build_parser().parse_args(["status", "--pipeline", "shop"])
    assert (status.state_root, status.storage_conn_id) == ("s3://lake/state", "aws_lake")
    verify = build_parser().parse_args(["verify", "--pipeline", "shop"])
    assert verify.sink_root == "s3://lake/tables" and verify.tables is None  # verify checks all, as the DAG's
    assert build_parser().parse_args(["check"]).tables == "shop.orders,shop.items"
    given = build_parser().parse_args(["stop", "--pipeline", "shop", "--state-root", "/data/state"])
    assert given.state_root == "/data/state"  # an option beats the environment


def test_without_them_the_roots_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["status", "--pipeline", "shop"])
    assert exc.value.code == 2 and "--state-root" in capsys.readouterr().err


def test_status_and_stop_of_an_unknown_pipeline_exit_1_naming_what_is_there(tmp_path: Path) -> None:
    StateStore(str(tmp_path), "shop").write_run(RunRecord(run_id="r1", state="stopped"))
    StateStore(str(tmp_path), "orders").write_json("manifest.json", {"tables": {}})
    for command in ("status", "stop"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--pipeline", "shpo", "--state-root", str(tmp_path)])
        msg = str(exc.value.code)
        assert msg.startswith(f"error: no pipeline 'shpo' under state root {tmp_path} (did you mean 'shop'?)")
        assert "pipelines there: orders, shop" in msg and "(--pipeline, and --state-root or MYSQLCDC_STATE_ROOT)" in msg


def test_status_of_a_known_pipeline_prints_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    StateStore(str(tmp_path), "shop").write_run(RunRecord(run_id="r1", state="stopped"))
    monkeypatch.setenv("MYSQLCDC_STATE_ROOT", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_CDC_DEFAULT", '{"conn_type": "mysql_cdc", "host": "127.0.0.1", "port": 1}')
    assert main(["status", "--pipeline", "shop", "--compact"]) == 0
    out = capsys.readouterr().out
    assert '"pipeline_id": "shop"' in out and '"run_id": "r1"' in out and '"server_offset_error"' in out
