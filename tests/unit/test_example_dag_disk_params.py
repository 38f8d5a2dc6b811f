"""The example DAG's disk params (issue 33, item 2) reach the stream operator with the stream's own
defaults, and the operator refuses what the UI form would let through, naming the fix."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.stream.options import StreamOptions

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "mysql_cdc.py"
DISK_PARAMS = ("rewrite_below_mb", "small_table_retention_seconds", "vacuum_retention_hours")


def _dag():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("example_dag_disk_params", DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def test_the_disk_params_default_to_the_streams_defaults_and_reach_its_task() -> None:
    dag = _dag()
    defaults = StreamOptions()
    assert [dag.params[p] for p in DISK_PARAMS] == [defaults.rewrite_below_mb, defaults.small_table_retention(),
                                                    defaults.maintenance.retention_hours]  # fmt: skip
    stream = dag.get_task("stream")
    for p in DISK_PARAMS:
        assert getattr(stream, p) == f"{{{{ params.{p} }}}}" and p in stream.template_fields


def test_what_the_form_sends_is_checked_before_the_stream_is_launched() -> None:
    stream = _dag().get_task("stream")
    stream.schema_change_policy = "lenient"  # rendered as the form's defaults render them (native objects)
    stream.rewrite_below_mb, stream.small_table_retention_seconds, stream.vacuum_retention_hours = 2, 120, 1.0
    assert stream.stream_args("r")[-4:] == ["--rewrite-below-mb", "2", "--small-table-retention-seconds", "120.0"]
    stream.small_table_retention_seconds = 0.5
    with pytest.raises(ValueError, match="small_table_retention_seconds must be a number of seconds, at least 1"):
        stream.stream_args("r")
