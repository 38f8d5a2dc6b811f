"""Which staged Parquet columns keep dictionary encoding (pure: from the table definition only)."""

from __future__ import annotations

from airflow_provider_mysqlcdc.cdc.types import dictionary_columns
from airflow_provider_mysqlcdc.source.schema import ColumnInfo, TableId, TableSchema


def _schema(*cols: tuple[str, str, str]) -> TableSchema:
    return TableSchema(
        TableId.parse("shop.t"),
        [ColumnInfo(name, i + 1, dtype, ctype, True) for i, (name, dtype, ctype) in enumerate(cols)],
        [cols[0][0]],
    )


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
