"""Reading DAG params: the run conf's keys against the DAG's params (a typo is refused, named)."""

from __future__ import annotations

from airflow_provider_mysqlcdc.core.param_values import unknown_keys_problem

PARAMS = ["pipeline_id", "tables", "exclude_tables", "sink_root", "state_root", "resnapshot_tables", "verify"]


def test_every_key_a_param_is_no_problem() -> None:
    assert unknown_keys_problem(["tables", "verify"], PARAMS) is None
    assert unknown_keys_problem([], PARAMS) is None


def test_a_typo_names_the_closest_param_and_every_param() -> None:
    msg = unknown_keys_problem(["pipeline_id", "tabels"], PARAMS, "DAG mysql_cdc")
    assert msg is not None
    assert "'tabels' (did you mean 'tables'?)" in msg and "is not a param of DAG mysql_cdc" in msg
    assert "nothing was run" in msg and "Trigger it again" in msg  # the fix
    assert msg.endswith(", ".join(sorted(PARAMS)))  # the known keys, each once


def test_several_unknown_keys_each_named_with_or_without_a_match() -> None:
    msg = unknown_keys_problem(["resnapshot_table", "colour", "verfy"], PARAMS)
    assert msg is not None and "are not params" in msg
    assert "'resnapshot_table' (did you mean 'resnapshot_tables'?)" in msg
    assert "'verfy' (did you mean 'verify'?)" in msg
    assert "'colour'," in msg and "'colour' (did you mean" not in msg
