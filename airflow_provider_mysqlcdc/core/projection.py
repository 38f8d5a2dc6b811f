"""The SQL reads of a table: what each reader asks the server for, so its values are canonical.

The type table (``core/types.py``) says what each column becomes; this module says how a SQL
reader gets exactly that: the plain projection (:func:`select_list`, for clients that decode
MySQL values themselves, e.g. pymysql), the native Arrow reader's (:func:`native_select_list` and
:func:`canonicalize_native`), and Spark JDBC's (:func:`jdbc_read`). Pure: SQL text and Arrow casts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core.table import TableSchema, quote_ident
from airflow_provider_mysqlcdc.core.types import ColumnType, _spark_ident, arrow_schema, column_types


def _zero_date_guard(value: str) -> str:
    """``value`` unless ``{c}`` is a zero or partial-zero date (NULL then): the driver rolls
    ``2024-00-15`` over to ``2023-12-15``, and year 0 is no date the lakehouse can hold."""
    return "IF(YEAR({c}) = 0 OR MONTH({c}) = 0 OR DAYOFMONTH({c}) = 0, NULL, " + value + ")"


_ZERO_DATE_GUARD = _zero_date_guard("{c}")


def select_template(ct: ColumnType) -> str:
    """The SQL expression (``{c}`` = the quoted column) the server returns ``ct``'s canonical value for."""
    k = ct.kind
    if k == "year":
        return "CAST({c} AS SIGNED)"  # keeps YEAR numeric even if a caller drops yearIsDateType=false
    if k == "float":
        # The text protocol prints FLOAT with 6 significant digits (16777216 -> 16777200); a DOUBLE
        # prints all of them, which parses back to the stored float.
        return "CAST({c} AS DOUBLE)"
    if k in ("datetime", "timestamp", "date"):
        return _ZERO_DATE_GUARD
    if k == "time":
        return "CAST({c} AS CHAR)"  # Connector/J 2.7 rejects TIME outside 00..23 h: read text
    if k == "decimal_text":
        return "CAST({c} AS CHAR)"
    if k == "string" and ct.data_type == "char":
        # Spark maps a JDBC CHAR(n) column to CharType and pads it back to n on read, although
        # MySQL strips the trailing spaces; CAST(.. AS CHAR) is a VARCHAR, which Spark leaves alone.
        return "CAST({c} AS CHAR)"
    if k in ("enum", "set"):
        return "CAST({c} AS CHAR)"  # the driver reports them as CHAR(longest value): see CHAR
    if k in ("bit", "bit64"):
        return "CAST({c} AS UNSIGNED)"
    return "{c}"


def select_list(table_schema: TableSchema) -> str:
    """The SELECT list that reads every column as its canonical value: ``expr AS `name`, ...``.

    For clients that decode MySQL values themselves (pymysql in ``verify``, and the base of
    :func:`native_select_list`); Spark's JDBC reader needs :func:`jdbc_read` instead.
    """
    out = []
    for ct in column_types(table_schema):
        q = quote_ident(ct.name)
        out.append(f"{select_template(ct).format(c=q)} AS {q}")
    return ", ".join(out)


# What connectorx 0.4 hands out, measured on MariaDB 10.11 (tests/integration/test_type_fidelity.py):
# integers in their own (unsigned) width, DECIMAL only at scale 10 (other scales fail), BIT as
# bytes, TIMESTAMP in the server's *global* time zone (it cannot set a session time zone), and a
# panic on GEOMETRY. So every DECIMAL and 64-bit unsigned value travels as text and is parsed
# exactly by Arrow, TIMESTAMP as epoch microseconds (UNIX_TIMESTAMP of a TIMESTAMP column is its
# stored UTC value, whatever the session zone), BIT as a number, and GEOMETRY tables use JDBC.
# FLOAT goes as it is: connectorx reads MySQL's binary protocol, which carries the float32 bits.
# DATE and DATETIME too: connectorx decodes them into proleptic Gregorian Arrow values (measured
# from 0001-01-01 to 9999-12-31, across 1582-10-05..14).
_TIMESTAMP_MICROS = "NULLIF(CAST(UNIX_TIMESTAMP({c}) * 1000000 AS SIGNED), 0)"
_NATIVE_SELECT: dict[str, str] = {
    "uint64": "CAST({c} AS CHAR)",
    "decimal": "CAST({c} AS CHAR)",
    "float": "{c}",
    "timestamp": _TIMESTAMP_MICROS,
    "bit1": "CAST({c} AS UNSIGNED)",
    "bit64": "CAST(CAST({c} AS UNSIGNED) AS CHAR)",
}
_NATIVE_UNSUPPORTED = {"geometry": "GEOMETRY values (the native reader cannot decode them)"}


def native_read_unsupported(table_schema: TableSchema) -> str | None:
    """Why the native reader cannot read this table exactly (None if it can)."""
    for ct in column_types(table_schema):
        if ct.kind in _NATIVE_UNSUPPORTED:
            return f"column {ct.name!r} holds {_NATIVE_UNSUPPORTED[ct.kind]}"
    return None


def native_select_list(table_schema: TableSchema) -> str:
    """The SELECT list for the native reader: :func:`select_list` where connectorx reads the
    canonical value exactly, a text or number form of it where it does not (see above)."""
    out = []
    for ct in column_types(table_schema):
        q = quote_ident(ct.name)
        template = _NATIVE_SELECT.get(ct.kind)
        out.append(f"{template.format(c=q) if template else select_template(ct).format(c=q)} AS {q}")
    return ", ".join(out)


def canonicalize_native(table: pa.Table, table_schema: TableSchema) -> pa.Table:
    """Cast what the native reader returned for :func:`native_select_list` to :func:`arrow_schema`.

    Every cast is a checked one (``safe=True``): a value that does not fit its canonical type
    raises instead of being truncated, so a driver change can fail a snapshot but never alter data.
    """
    target = arrow_schema(table_schema)
    cols = []
    for ct, field in zip(column_types(table_schema), target, strict=True):
        col = table.column(ct.name)
        if ct.kind == "bit1":
            col = pc.not_equal(col, pa.scalar(0, col.type))
        elif ct.kind == "timestamp":
            col = col.cast(pa.int64()).cast(field.type)
        elif pa.types.is_timestamp(col.type) and col.type.tz is None:
            col = col.cast(pa.timestamp("us")).cast(field.type)  # wall time labelled UTC, as on JDBC
        if col.type != field.type:
            col = col.cast(field.type, safe=True)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=target)


# --------------------------------------------------------------------------- Spark JDBC reader
# kind -> (what the server sends, the customSchema type Spark reads it as, the Spark SQL that makes
# it the canonical value). Integers because the driver would build java.sql.Date/Timestamp, whose
# hybrid Julian/Gregorian calendar has no 1582-10-05..14 (read ten days late) and which Spark
# rebases in the JVM's zone before 1900; TO_DAYS and TIMESTAMPDIFF count proleptic Gregorian days
# as MySQL stores them, and Spark's date_from_unix_date / timestamp_micros are proleptic too.
_UNIX_EPOCH_TO_DAYS = 719528  # TO_DAYS('1970-01-01')
_JDBC_INTEGER_FORMS: dict[str, tuple[str, str, str]] = {
    "date": (_zero_date_guard(f"TO_DAYS({{c}}) - {_UNIX_EPOCH_TO_DAYS}"), "INT", "date_from_unix_date({c})"),
    "datetime": (
        _zero_date_guard("TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {c})"),
        "BIGINT",
        "timestamp_micros({c})",
    ),
    # the stored UTC instant, whatever the session zone (TIMESTAMP starts after the epoch: 0 is zero)
    "timestamp": (_TIMESTAMP_MICROS, "BIGINT", "timestamp_micros({c})"),
}


@dataclass(frozen=True)
class JdbcRead:
    """How Spark's JDBC reader reads a table: ``spark.read.jdbc(url, "(SELECT <select_list> FROM t)
    AS src", predicates, {customSchema: custom_schema})`` then ``.selectExpr(*spark_exprs)``, which
    yields :func:`spark_schema_ddl`'s columns in table order, so the staged Parquet has
    :func:`arrow_schema`."""

    select_list: str
    custom_schema: str
    spark_exprs: tuple[str, ...]


def jdbc_read(table_schema: TableSchema, key_columns: Iterable[str] = ()) -> JdbcRead:
    """The Spark JDBC read of the table (see :class:`JdbcRead` and the module docstring).

    ``key_columns`` are the columns the chunk predicates compare. Spark puts the predicates in a
    WHERE around the projection, so each of them whose projection is not the bare column is also
    projected raw under its own name (its value travels under a reserved alias): the predicates
    then compare stored values, in the column's collation, and can use the index, instead of
    comparing day counts with date literals or a CAST's collation.
    """
    keys = set(key_columns)
    cts = column_types(table_schema)
    taken = {ct.name.lower() for ct in cts}
    select, schema, exprs = [], [], []
    for i, ct in enumerate(cts):
        q = quote_ident(ct.name)
        template, read_type, finish = _JDBC_INTEGER_FORMS.get(ct.kind, (select_template(ct), ct.spark_ddl, "{c}"))
        alias = ct.name
        if ct.name in keys and template != "{c}":
            alias = f"_cdc_value_{i}"
            while alias.lower() in taken:
                alias = "_" + alias
            taken.add(alias.lower())
            select.append(f"{q} AS {q}")
        select.append(f"{template.format(c=q)} AS {quote_ident(alias)}")
        schema.append(f"{_spark_ident(alias)} {read_type}")
        exprs.append(f"{finish.format(c=_spark_ident(alias))} AS {_spark_ident(ct.name)}")
    return JdbcRead(", ".join(select), ", ".join(schema), tuple(exprs))
