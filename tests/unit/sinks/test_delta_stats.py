"""The statistics columns a table declares, and the all-or-nothing file statistics (plain data)."""

from __future__ import annotations

import json

import pyarrow as pa

from airflow_provider_mysqlcdc.sinks.delta_stats import (
    declared_stats_columns,
    file_stats,
    merge_range,
    stats_columns_for,
    stats_properties,
)

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("at", pa.timestamp("us")), ("ok", pa.bool_()),
                    ("amount", pa.decimal128(10, 2)), ("big", pa.uint64()), ("odd, name", pa.large_string()),
                    ("tick`s", pa.int32())])  # fmt: skip


def test_key_columns_of_exact_json_types_get_statistics() -> None:
    key = ["at", "id", "name", "ok", "amount", "big", "odd, name", "tick`s", "gone"]
    assert stats_columns_for(SCHEMA, key) == ["id", "name", "big", "odd, name"]
    assert stats_columns_for(SCHEMA, ["at"]) == []


def test_declared_columns_round_trip_through_the_table_property() -> None:
    for cols in (["id"], ["id", "name"], ["odd, name", "id"], []):
        assert declared_stats_columns(stats_properties(cols)) == cols
    assert stats_properties([]) == {"delta.dataSkippingNumIndexedCols": "0"}
    assert declared_stats_columns({}) is None  # delta's default (first 32 columns): not ours
    assert declared_stats_columns(None) is None
    assert declared_stats_columns({"delta.dataSkippingNumIndexedCols": "5"}) is None
    assert declared_stats_columns({"delta.dataSkippingStatsColumns": "a, `b,c`"}) == ["a", "b,c"]


def test_a_file_gets_min_max_of_every_declared_column_or_of_none() -> None:
    ranges = {"id": (1, 9, 0), "name": ("a", "z", 0)}
    full = json.loads(file_stats(10, ranges, ["id", "name"]))
    assert full == {"numRecords": 10, "minValues": {"id": 1, "name": "a"}, "maxValues": {"id": 9, "name": "z"},
                    "nullCount": {"id": 0, "name": 0}}  # fmt: skip
    assert json.loads(file_stats(10, ranges, ["id"]))["minValues"] == {"id": 1}  # extra ranges are not written
    for columns in (["id", "name", "big"], None, []):  # one missing, undeclared, none declared
        assert json.loads(file_stats(10, ranges, columns)) == {"numRecords": 10}
    assert json.loads(file_stats(0, ranges, ["id"])) == {"numRecords": 0}
    assert json.loads(file_stats(10, {"id": (1, 9, 2)}, ["id"])) == {"numRecords": 10}  # nulls: no range
    assert json.loads(file_stats(10, {"id": (None, None, 10)}, ["id"])) == {"numRecords": 10}


def test_ranges_of_parts_merge() -> None:
    ranges: dict[str, tuple[object, object, int]] = {}
    merge_range(ranges, "id", 5, 7, 0)
    merge_range(ranges, "id", None, None, 3)  # an all-null part
    merge_range(ranges, "id", 2, 6, 0)
    merge_range(ranges, "id", 4, 9, 1)
    assert ranges == {"id": (2, 9, 4)}
    merge_range(ranges, "s", None, None, 2)
    merge_range(ranges, "s", "b", "c", 0)
    assert ranges["s"] == ("b", "c", 2)
