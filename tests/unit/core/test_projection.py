"""Which staged Parquet columns keep dictionary encoding (pure: from the table definition only)."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_provider_mysqlcdc.core.projection import canonicalize_native, native_select_list
from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema
from airflow_provider_mysqlcdc.core.types import arrow_schema, dictionary_columns


def _schema(*cols: tuple[str, str, str]) -> TableSchema:
    """Columns as information_schema describes them (DECIMAL(p,s) with its precision and scale)."""

    def column(i: int, name: str, dtype: str, ctype: str) -> ColumnInfo:
        m = re.fullmatch(r"decimal\((\d+),(\d+)\)", ctype)
        p, s = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        return ColumnInfo(name, i + 1, dtype, ctype, True, numeric_precision=p, numeric_scale=s)

    return TableSchema(TableId.parse("shop.t"), [column(i, *c) for i, c in enumerate(cols)], [cols[0][0]])


def test_small_domain_types_keep_the_dictionary_and_the_rest_is_plain() -> None:
    schema = _schema(
        ("id", "bigint", "bigint(20)"),
        ("flag", "tinyint", "tinyint(4)"),
        ("ok", "tinyint", "tinyint(1)"),
        ("uflag", "tinyint", "tinyint(3) unsigned"),
        ("status", "enum", "enum('new','paid')"),
        ("tags", "set", "set('a','b')"),
        ("yr", "year", "year(4)"),
        ("b1", "bit", "bit(1)"),
        ("b16", "bit", "bit(16)"),
        ("b17", "bit", "bit(17)"),
        ("amount", "decimal", "decimal(12,2)"),
        ("created", "datetime", "datetime(6)"),
        ("note", "varchar", "varchar(200)"),
        ("n", "int", "int(11)"),
    )
    assert dictionary_columns(schema) == ["flag", "ok", "uflag", "status", "tags", "yr", "b1", "b16"]


def test_names_parquet_options_cannot_address_stay_plain() -> None:
    schema = _schema(("id", "bigint", "bigint(20)"), ("a.b", "tinyint", "tinyint(4)"), ("c#d", "enum", "enum('x')"))
    assert dictionary_columns(schema) == []


# --------------------------------------------------------------------------- native reader, pure parts


def test_native_select_list_sends_exact_forms_for_what_the_driver_cannot_decode() -> None:
    schema = _schema(
        ("id", "bigint", "bigint(20) unsigned"),
        ("amount", "decimal", "decimal(12,2)"),
        ("ts", "timestamp", "timestamp(6)"),
        ("b1", "bit", "bit(1)"),
        ("n", "int", "int(11)"),
    )
    sql = native_select_list(schema)
    assert "CAST(`id` AS CHAR) AS `id`" in sql
    assert "CAST(`amount` AS CHAR) AS `amount`" in sql
    assert "NULLIF(CAST(UNIX_TIMESTAMP(`ts`) * 1000000 AS SIGNED), 0) AS `ts`" in sql
    assert "CAST(`b1` AS UNSIGNED) AS `b1`" in sql
    assert "`n` AS `n`" in sql


def test_canonicalize_native_casts_exactly_and_refuses_loss() -> None:
    schema = _schema(
        ("id", "bigint", "bigint(20) unsigned"),
        ("amount", "decimal", "decimal(12,2)"),
        ("ts", "timestamp", "timestamp(6)"),
        ("dt", "datetime", "datetime(6)"),
        ("b1", "bit", "bit(1)"),
        ("u8", "tinyint", "tinyint(3) unsigned"),
        ("bin", "varbinary", "varbinary(4)"),
    )
    raw = pa.table({
        "id": pa.array(["18446744073709551615", None]),
        "amount": pa.array(["-12.30", "0.00"]),
        "ts": pa.array([1_000_000, None], pa.int64()),
        "dt": pa.array([dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None], pa.timestamp("us")),
        "b1": pa.array([1, 0], pa.uint32()),
        "u8": pa.array([255, None], pa.uint8()),
        "bin": pa.array([b"\x00\xff", b""], pa.large_binary()),
    })
    out = canonicalize_native(raw, schema)
    assert out.schema.equals(arrow_schema(schema))
    utc = dt.UTC
    assert out.to_pylist() == [
        {"id": Decimal("18446744073709551615"), "amount": Decimal("-12.30"),
         "ts": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=utc),
         "dt": dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc), "b1": True, "u8": 255, "bin": b"\x00\xff"},
        {"id": None, "amount": Decimal("0.00"), "ts": None, "dt": None, "b1": False, "u8": None, "bin": b""},
    ]
    # A value that does not fit its canonical type fails loudly instead of being rounded.
    with pytest.raises(pa.ArrowInvalid):
        canonicalize_native(raw.set_column(1, "amount", pa.array(["1.234", "0"])), schema)
