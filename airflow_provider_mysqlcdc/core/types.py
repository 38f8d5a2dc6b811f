"""The type table: how each MySQL/MariaDB column becomes a lakehouse column (``docs/types.md``).

This module decides, per column, its canonical kind, Arrow (= Delta) type and Spark type. The three
read paths adapt to it and must agree value for value (docs/architecture.md, "Invariants"):

* **snapshot, Spark JDBC** — reads the projection :func:`~core.projection.jdbc_read` builds (the
  server hands out the canonical value, or an exact integer form of it for dates and times);
* **snapshot, native reader** — connectorx reads :func:`~core.projection.native_select_list`
  straight into Arrow, :func:`~core.projection.canonicalize_native` casts it exactly;
* **binlog** — python-mysql-replication or the generated decoder decodes row images,
  :func:`~mysql.binlog_values.binlog_row_converter` makes them canonical and :func:`rows_to_arrow`
  turns them into Arrow with :func:`arrow_schema`.

Every rule below was checked on MariaDB 10.11 + Connector/J 2.7.6 + Spark 4.2 + mysql-replication
1.0.17 by ``tests/integration/test_type_fidelity.py``; ``docs/types.md`` is the user-facing table.

The canonical mapping (arrow type / Spark type):

=====================  =========================  ==============================================
MySQL                  Arrow / Spark              note
=====================  =========================  ==============================================
TINYINT (incl. (1))    int8 / TINYINT             TINYINT(1) holds -128..127: not a boolean
SMALLINT               int16 / SMALLINT
MEDIUMINT, INT         int32 / INT
BIGINT                 int64 / BIGINT
... UNSIGNED           one size wider             BIGINT UNSIGNED -> decimal(20,0)
DECIMAL(p,s) p<=38     decimal128(p,s) / DECIMAL
DECIMAL(p,s) p>38      string / STRING            plain text with exactly s decimals
FLOAT / DOUBLE         float32 / float64          FLOAT is the stored float32, all 24 bits
DATETIME, TIMESTAMP    timestamp[us, UTC]         DATETIME wall time read as UTC; zero -> NULL
DATE                   date32 / DATE              zero or partial-zero date -> NULL
(all temporal types)                              proleptic Gregorian, 0001-01-01..9999-12-31
TIME(fsp)              string                     ``[-]H+:MM:SS[.f{fsp}]``
YEAR                   int16 / SMALLINT           YEAR 0000 -> 0
CHAR..LONGTEXT, JSON   string                     JSON: the stored text on MariaDB
BINARY..LONGBLOB       binary                     BINARY(n) keeps its 0x00 padding
ENUM / SET             string                     label / labels joined by ',' ('' empty set)
BIT(1)                 bool / BOOLEAN
BIT(2..63) / BIT(64)   int64 / decimal(20,0)      unsigned value
GEOMETRY family        binary                     MySQL internal: 4-byte LE SRID + WKB
=====================  =========================  ==============================================

Every field is nullable: zero dates become NULL even in NOT NULL columns, and Spark's JDBC reader
marks every column nullable anyway.

Pure: pyarrow only (Airflow workers and Spark tasks import it alike).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableSchema, enum_values

_SIGNED_INT = {"tinyint": (pa.int8(), "TINYINT"), "smallint": (pa.int16(), "SMALLINT"),
               "mediumint": (pa.int32(), "INT"), "int": (pa.int32(), "INT"), "integer": (pa.int32(), "INT"),
               "bigint": (pa.int64(), "BIGINT")}
_UNSIGNED_INT = {"tinyint": (pa.int16(), "SMALLINT"), "smallint": (pa.int32(), "INT"),
                 "mediumint": (pa.int32(), "INT"), "int": (pa.int64(), "BIGINT"), "integer": (pa.int64(), "BIGINT"),
                 "bigint": (pa.decimal128(20, 0), "DECIMAL(20,0)")}
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json"}
_BYTES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_GEOMETRY = {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
             "geometrycollection", "geomcollection"}
_MAX_DECIMAL128 = 38

class UnsupportedColumnType(ValueError):
    """A column type has no canonical lakehouse mapping; the message names the column and the fix."""


@dataclass(frozen=True)
class ColumnType:
    """One column's canonical type: its kind, Arrow/Delta type and Spark type, and what the read
    paths need to produce its values (precision, charset, padding, ENUM/SET labels).

    ``kind`` is the rule name (``int``, ``timestamp``, ``time`` ...) the adapters dispatch on:
    ``core/projection.py`` (SQL reads) and ``mysql/binlog_values.py`` (binlog images).
    """

    name: str
    mysql_type: str
    data_type: str
    kind: str
    arrow_type: pa.DataType
    spark_ddl: str
    nullable: bool = True
    scale: int = 0  # DECIMAL
    fsp: int = 0  # TIME fraction digits
    charset: str | None = None  # text
    pad_to: int | None = None  # BINARY(n)
    labels: tuple[str, ...] = ()  # ENUM / SET members in definition order


def column_type(col: ColumnInfo) -> ColumnType:
    """The canonical type of one column (see the module docstring for the table and reasons)."""
    t = col.data_type.lower()
    ct = col.column_type.lower()

    def make(kind: str, arrow: pa.DataType, spark: str, **kw: Any) -> ColumnType:
        return ColumnType(col.name, col.column_type, t, kind, arrow, spark, col.nullable, **kw)

    if t in _SIGNED_INT:
        arrow, spark = (_UNSIGNED_INT if col.unsigned else _SIGNED_INT)[t]
        if pa.types.is_decimal(arrow):
            return make("uint64", arrow, spark)
        return make("int", arrow, spark)
    if t == "year":
        return make("year", pa.int16(), "SMALLINT")
    if t in ("decimal", "numeric"):
        p = col.numeric_precision or 10
        s = col.numeric_scale or 0
        if p <= _MAX_DECIMAL128:
            return make("decimal", pa.decimal128(p, s), f"DECIMAL({p},{s})", scale=s)
        return make("decimal_text", pa.string(), "STRING", scale=s)
    if t == "float":
        return make("float", pa.float32(), "FLOAT")
    if t in ("double", "real"):
        return make("double", pa.float64(), "DOUBLE")
    if t == "datetime":
        return make("datetime", pa.timestamp("us", tz="UTC"), "TIMESTAMP")
    if t == "timestamp":
        return make("timestamp", pa.timestamp("us", tz="UTC"), "TIMESTAMP")
    if t == "date":
        return make("date", pa.date32(), "DATE")
    if t == "time":
        return make("time", pa.string(), "STRING", fsp=col.datetime_precision or 0)
    if t in _TEXT:
        if (col.charset or "").lower() == "binary":  # e.g. VARCHAR(..) CHARACTER SET binary
            return make("bytes", pa.binary(), "BINARY")
        if t == "json":
            return make("json", pa.string(), "STRING")
        return make("string", pa.string(), "STRING", charset=col.charset)
    if t in _BYTES:
        return make("bytes", pa.binary(), "BINARY", pad_to=col.char_max_length if t == "binary" else None)
    if t == "enum":
        return make("enum", pa.string(), "STRING", labels=tuple(enum_values(col.column_type)))
    if t == "set":
        return make("set", pa.string(), "STRING", labels=tuple(enum_values(col.column_type)))
    if t == "bit":
        m = re.match(r"bit\s*\((\d+)\)", ct)
        bits = int(m.group(1)) if m else (col.numeric_precision or 1)
        if bits == 1:
            return make("bit1", pa.bool_(), "BOOLEAN")
        if bits <= 63:
            return make("bit", pa.int64(), "BIGINT")
        return make("bit64", pa.decimal128(20, 0), "DECIMAL(20,0)")
    if t in _GEOMETRY:
        # Lossless: MySQL's internal value (4-byte little-endian SRID, then WKB) on every path.
        return make("geometry", pa.binary(), "BINARY")
    raise UnsupportedColumnType(
        f"column {col.name!r} has type {col.column_type}, which the CDC type mapping does not support "
        "(see docs/types.md): exclude the table, or change the column to a supported type"
    )


def column_types(table_schema: TableSchema) -> list[ColumnType]:
    """Canonical types of every column, in table order; raises on the first unsupported one."""
    return [column_type(c) for c in table_schema.columns]


def arrow_schema(table_schema: TableSchema) -> pa.Schema:
    """The Arrow (= Delta) schema of the table's lakehouse copy. Every field is nullable."""
    return pa.schema([pa.field(ct.name, ct.arrow_type, nullable=True) for ct in column_types(table_schema)])


def _spark_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def spark_schema_ddl(table_schema: TableSchema) -> str:
    """The canonical Spark schema of the table: ``\\`a\\` INT, ...`` (what the JDBC read's frame
    holds; the staged Parquet written from it has :func:`arrow_schema`)."""
    return ", ".join(f"{_spark_ident(ct.name)} {ct.spark_ddl}" for ct in column_types(table_schema))


def rows_to_arrow(rows: Iterable[Mapping[str, Any]], table_schema: TableSchema) -> pa.Table:
    """Canonical rows (from :func:`binlog_row_converter`) as an Arrow table with :func:`arrow_schema`."""
    schema = arrow_schema(table_schema)
    rows = list(rows)
    columns = [pa.array([r[f.name] for r in rows], type=f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


_SMALL_DOMAIN_KINDS = {"year", "enum", "set", "bit1"}


def dictionary_columns(table_schema: TableSchema) -> list[str]:
    """Columns whose staged Parquet pages keep dictionary encoding: types with a small domain.

    Why not all: a dictionary costs the writer a hash lookup per value and is discarded anyway
    once it outgrows its page, which is what keys, amounts, timestamps and free text do: the
    staging write is faster without it and the files are no larger (bench/RESULTS.md). Types
    whose values come from a short list (TINYINT, YEAR, ENUM, SET, BIT(1..16)) keep it: cheap to
    build, and it shrinks them several-fold.
    Column names Parquet's per-column options cannot address (``.`` or ``#`` in the name) stay plain.
    """
    out = []
    for ct in column_types(table_schema):
        small = ct.kind in _SMALL_DOMAIN_KINDS or ct.mysql_type.lower().startswith("tinyint")
        if ct.kind == "bit":
            m = re.match(r"bit\s*\((\d+)\)", ct.mysql_type.lower())
            small = bool(m) and int(m.group(1)) <= 16
        if small and "." not in ct.name and "#" not in ct.name:
            out.append(ct.name)
    return out
