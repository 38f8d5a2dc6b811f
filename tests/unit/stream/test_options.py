"""StreamOptions refuses values that cannot work, naming the option."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.stream.options import StreamOptions


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"apply_memory_mb": 8}, "apply_memory_mb"), ({"apply_threads": 0}, "apply_threads"),
     ({"rewrite_below_mb": -1}, "rewrite_below_mb"), ({"schema_change_policy": "ignore"}, "ignore"),
     ({"apply_processes": -1}, "apply_processes"), ({"trigger_seconds": -0.5}, "trigger_seconds")],
)  # fmt: skip
def test_bad_options_are_refused(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        StreamOptions(**kwargs)


def test_small_tables_skip_the_merge_by_default() -> None:
    assert StreamOptions().rewrite_below_mb == 2 and StreamOptions().deletion_vectors
    assert StreamOptions(rewrite_below_mb=0).rewrite_below_mb == 0
