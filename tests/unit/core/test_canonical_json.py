"""Canonical values survive the manifest's JSON exactly (core/canonical_json.py)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from airflow_provider_mysqlcdc.core.canonical_json import from_json, to_json

VALUES = [None, True, 0, -5, 2**63, 1.100000023841858, "", "it's \\ x", "é€", Decimal("1.50"), Decimal("-0E-10"),
          Decimal("18446744073709551615"), dt.datetime(2020, 2, 3, 4, 5, 6, 789000, tzinfo=dt.UTC),
          dt.date(2020, 2, 29), b"", b"ab\x00\x00", b"\x00\xff"]  # fmt: skip


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_round_trip_through_json_unchanged(value: object) -> None:
    back = from_json(json.loads(json.dumps(to_json(value))))
    assert back == value and type(back) is type(value)
    if isinstance(value, Decimal):
        assert str(back) == str(value) or back.is_zero()  # the scale is kept (1.50 stays 1.50)


def test_a_timestamp_is_written_in_utc_and_unknown_forms_are_refused() -> None:
    plus_one = dt.datetime(2020, 1, 1, 1, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert to_json(plus_one) == {"timestamp": "2020-01-01T00:00:00+00:00"}
    with pytest.raises(TypeError, match="no JSON form"):
        to_json(object())
    with pytest.raises(ValueError, match="not a canonical value"):
        from_json({"uuid": "x"})
