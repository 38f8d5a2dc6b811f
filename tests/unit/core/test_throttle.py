"""The snapshot throttle's arithmetic: the limit shared by groups and read slots, the pause per chunk."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.core.throttle import pause_after_read, read_slot_rate


def test_the_limit_is_shared_by_the_groups_and_the_slots_that_read_at_once() -> None:
    assert read_slot_rate(10_000, 2, 4) == 1_250
    assert read_slot_rate(10_000, 0, 0) == 10_000  # never divides by zero
    with pytest.raises(ValueError, match="positive"):
        read_slot_rate(0, 1, 1)


def test_a_slot_waits_until_its_rows_fit_its_rate() -> None:
    assert pause_after_read(5_000, 0.5, 1_000) == pytest.approx(4.5)
    assert pause_after_read(5_000, 6.0, 1_000) == 0.0  # already slower than the rate
    assert pause_after_read(5_000, 0.5, None) == 0.0  # unthrottled
    assert pause_after_read(0, 0.0, 1_000) == 0.0  # an empty chunk
