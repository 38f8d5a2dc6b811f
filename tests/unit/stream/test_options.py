"""StreamOptions refuses values that cannot work, naming the option."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.stream.options import StreamOptions


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"apply_memory_mb": 8}, "apply_memory_mb"), ({"apply_threads": 0}, "apply_threads"),
     ({"rewrite_below_mb": -1}, "rewrite_below_mb"), ({"schema_change_policy": "ignore"}, "ignore"),
     ({"apply_processes": -1}, "apply_processes"), ({"trigger_seconds": -0.5}, "trigger_seconds"),
     ({"small_table_retention_seconds": 0}, "small_table_retention_seconds must be a number of seconds, at least 1"),
     ({"small_table_retention_seconds": 7200}, "lower small_table_retention_seconds or raise vacuum_retention_hours"),
     ({"rewrite_below_mb": 1024}, "lower rewrite_below_mb or raise apply_memory_mb"),
     ({"rewrite_below_mb": 2.5}, "rewrite_below_mb must be a whole number")],
)  # fmt: skip
def test_bad_options_are_refused(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        StreamOptions(**kwargs)


def test_small_tables_skip_the_merge_by_default() -> None:
    from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy

    assert StreamOptions().rewrite_below_mb == 2 and StreamOptions().deletion_vectors
    assert StreamOptions(rewrite_below_mb=0).rewrite_below_mb == 0
    assert StreamOptions().small_table_retention() == 120
    short = MaintenancePolicy(retention_hours=0.01)
    assert StreamOptions(maintenance=short).small_table_retention() == 36  # the default, never above the vacuum


def test_a_longer_small_table_retention_needs_a_longer_vacuum_retention() -> None:
    from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy

    policy = MaintenancePolicy(retention_hours=3, log_retention_hours=24)
    assert StreamOptions(small_table_retention_seconds=7200, maintenance=policy).small_table_retention() == 7200
