"""The value an ``ALTER TABLE ... ADD COLUMN`` gave the rows a table already had.

Why: the server fills the new column of every existing row with the column's default (or, for a NOT
NULL column without one, its type's implicit default: 0, '', the first ENUM member, a zero date)
and logs no row change for it; binlog images written before the ALTER lack the column. The stream
writes this value into the lake's existing rows and decodes older images with it
(stream/schema_follow.py, docs/architecture.md "Schema changes").

A literal default is read by the server itself — ``DEFAULT(col)``, typed as the column — and made
canonical as a binlog value would be. An expression default (``CURRENT_TIMESTAMP``, ``UUID()``) was
evaluated when the ALTER ran, which cannot be known afterwards: it is reported, never guessed.
"""

from __future__ import annotations

import datetime as dt
import re
import struct
from collections.abc import Sequence
from typing import Any

from airflow_provider_mysqlcdc.core.table import TableSchema, quote_ident
from airflow_provider_mysqlcdc.core.types import ColumnType, column_type
from airflow_provider_mysqlcdc.mysql.binlog_values import binlog_converter, format_time
from airflow_provider_mysqlcdc.mysql.server import server_info

# information_schema's form of a literal default on MariaDB: a quoted string, a number, a bit value
_LITERAL = re.compile(r"'.*'|[-+]?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|b'[01]*'", re.S)


def is_literal_default(default: str, extra: str, mariadb: bool) -> bool:
    """Whether ``information_schema.COLUMNS``' COLUMN_DEFAULT / EXTRA describe a literal (a value the
    server stored once, the same in every row) rather than an expression evaluated per row.

    MariaDB writes literals quoted or as numbers and expressions bare (``current_timestamp()``);
    MySQL 8 writes literals bare and marks expressions ``DEFAULT_GENERATED`` in EXTRA.
    """
    if "DEFAULT_GENERATED" in extra.upper():
        return False
    return bool(_LITERAL.fullmatch(default)) if mariadb else True
_TEMPORAL = {"datetime", "timestamp", "date"}


def added_column_values(
    conn: Any, schema: TableSchema, columns: Sequence[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``(values, expressions)`` for ``columns`` of ``schema`` (the table's definition now).

    ``values``: per column, the canonical value the rows that existed before its ADD COLUMN hold
    (None: they read NULL). ``expressions``: columns whose default is an expression (name -> the
    expression as the server writes it); their value is not known and not in ``values``. Neither
    has a NOT NULL column with a literal default of an empty table: the server reads that default
    only from a row, and no row needs it (every row the ALTER filled was deleted since).
    """
    table = schema.table
    mariadb = server_info(conn).is_mariadb
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, COLUMN_DEFAULT, EXTRA FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (table.database, table.table))  # fmt: skip
        info = {str(n).lower(): (d, str(e or "")) for n, d, e in cur.fetchall()}
        values: dict[str, Any] = {}
        expressions: dict[str, str] = {}
        literal: list[str] = []
        for name in columns:
            ct = column_type(schema.column(name))
            default, extra = info.get(name.lower(), (None, ""))
            if default is None or (mariadb and str(default).upper() == "NULL"):  # no default, or DEFAULT NULL
                values[name] = None if ct.nullable else implicit_default(ct)
            elif not is_literal_default(str(default), extra, mariadb):
                expressions[name] = str(default)
            else:
                literal.append(name)
        if literal:
            exprs = ", ".join(f"DEFAULT(t.{quote_ident(c)})" for c in literal)
            cur.execute(f"SELECT {exprs} FROM {table.quoted} AS t LIMIT 1")
            row = cur.fetchone()
            if row is None:  # no row to fill; an outer join's missing row gives the nullable columns' defaults
                cur.execute(f"SELECT {exprs} FROM (SELECT 1) AS one LEFT JOIN {table.quoted} AS t ON FALSE")
                row = cur.fetchone()
            for name, raw in zip(literal, row, strict=True):
                ct = column_type(schema.column(name))
                if raw is not None or ct.nullable:  # (a NOT NULL column's default reads NULL there: not needed)
                    values[name] = canonical_default(ct, raw)
    return values, expressions


def canonical_default(ct: ColumnType, raw: Any) -> Any:
    """The canonical value (core/types.py) of a value the server returned for a column of type ``ct``."""
    if raw is None:
        return None
    if ct.kind in _TEMPORAL and isinstance(raw, str | bytes):  # a zero date comes back as text: NULL, as JDBC reads it
        return None
    if ct.kind == "time":
        return format_time(raw, ct.fsp)
    if ct.kind == "float":  # the server prints the shortest decimal; the column holds its float32
        return struct.unpack("<f", struct.pack("<f", float(raw)))[0]
    if ct.kind in ("bit1", "bit", "bit64") and isinstance(raw, bytes):
        raw = int.from_bytes(raw, "big")
    return binlog_converter(ct)(raw)


def implicit_default(ct: ColumnType) -> Any:
    """What the server puts in a NOT NULL column without a default, canonical (a zero date: NULL)."""
    zero: dict[str, Any] = {"int": 0, "year": 0, "uint64": 0, "float": 0.0, "double": 0.0, "string": "",
                            "json": "", "set": "", "bit1": 0, "bit": 0, "bit64": 0, "decimal": 0,
                            "decimal_text": 0}  # fmt: skip
    if ct.kind in zero:
        return binlog_converter(ct)(zero[ct.kind])
    if ct.kind == "time":
        return format_time(dt.timedelta(0), ct.fsp)
    if ct.kind == "bytes":
        return b"\x00" * (ct.pad_to or 0)
    if ct.kind == "enum":
        return ct.labels[0] if ct.labels else ""
    return None  # temporal kinds (a zero date), geometry


__all__ = ["added_column_values", "canonical_default", "implicit_default", "is_literal_default"]
