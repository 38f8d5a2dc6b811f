"""The one definition of how a MySQL/MariaDB column value becomes a lakehouse value.

Two paths produce rows and must agree value for value (DESIGN §4):

* **snapshot** — Spark JDBC (MariaDB Connector/J 2.7) runs the projection :func:`jdbc_read`
  builds, with its ``customSchema``, then one ``selectExpr``; Spark stages Parquet, the Delta sink
  adopts the files. The SQL projection makes the server hand out the canonical value (TIME as text,
  zero dates as NULL, BIT as a number ...) or an exact integer form of it: DATE as days and
  DATETIME/TIMESTAMP as microseconds since 1970-01-01, which the ``selectExpr`` turns into Spark
  dates and timestamps. Why: the driver builds ``java.sql.Date``/``Timestamp`` in the hybrid
  Julian/Gregorian calendar, where 1582-10-05..14 do not exist (they came out ten days late) and
  which Spark rebases in the JVM's zone; integers skip both, in any JVM zone. FLOAT travels as
  ``CAST(f AS DOUBLE)``: the server prints FLOAT with 6 significant digits (16777216 -> 16777200)
  but a DOUBLE with all of them, and the driver's ``getFloat`` parses that text to the stored float;
* **snapshot, native reader** — the same chunks read by connectorx straight into Arrow (MySQL's
  binary protocol, no JVM row conversion) with :func:`native_select_list`, then
  :func:`canonicalize_native` casts its Arrow types to :func:`arrow_schema` (exact casts only);
* **binlog** — python-mysql-replication decodes row images; :func:`binlog_row_converter` turns
  them into the same Python values and :func:`rows_to_arrow` into Arrow with :func:`arrow_schema`.

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

This module imports pyarrow but never pyspark (Airflow workers import it without a JVM).
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.source.schema import ColumnInfo, TableSchema, enum_values, quote_ident

UTC = dt.UTC
MARIADB_JDBC_DRIVER = "org.mariadb.jdbc.Driver"

#: Connector/J 2.7 options for JDBC reads of this package:
#:
#: * ``sessionVariables=time_zone='+00:00'`` — TIMESTAMP columns are rendered in the session
#:   zone; UTC makes them the instant the binlog carries. The value must *not* be URL-encoded
#:   (Connector/J 2.7 sends ``%2B00:00`` literally and the connect fails).
#: * ``useLegacyDatetimeCode=false`` + ``serverTimezone=UTC`` — the driver builds
#:   ``java.sql.Timestamp`` from the wall time in UTC instead of the executor JVM's default zone
#:   (else DATETIME shifts by the JVM's offset: 5 h on an America/New_York JVM).
#: * ``tinyInt1isBit=false`` — otherwise TINYINT(1) arrives as BOOLEAN and 2..127 become true.
#: * ``yearIsDateType=false`` — otherwise YEAR arrives as a DATE (Jan 1st of the year).
#:
#: The snapshot's :func:`jdbc_read` projection sends temporal values as integers, so its values no
#: longer depend on the first three (nor on the JVM's zone); they stay for any read of a plain
#: column, where each one changes a value when absent.
JDBC_URL_OPTIONS: dict[str, str] = {
    "sessionVariables": "time_zone='+00:00'",
    "useLegacyDatetimeCode": "false",
    "serverTimezone": "UTC",
    "tinyInt1isBit": "false",
    "yearIsDateType": "false",
}

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
_EPOCH = dt.datetime(1970, 1, 1)
_DEC_CONTEXT = decimal.Context(prec=100)


class UnsupportedColumnType(ValueError):
    """A column type has no canonical lakehouse mapping; the message names the column and the fix."""


@dataclass(frozen=True)
class ColumnType:
    """How one column travels: its Arrow/Delta type, its Spark type, its SQL read, its binlog fix-up.

    ``kind`` is the internal rule name (``int``, ``timestamp``, ``time`` ...), useful in errors
    and tests; ``select_template`` is the SQL projection with ``{c}`` for the quoted column.
    """

    name: str
    mysql_type: str
    kind: str
    arrow_type: pa.DataType
    spark_ddl: str
    select_template: str
    _from_binlog: Callable[[Any], Any]
    _empty_set_is_none: bool = False  # SET: the binlog decoder reports '' as None
    _not_null: bool = False  # the column is NOT NULL: a None from the decoder cannot be NULL

    def select_expr(self, quoted_column: str) -> str:
        """SQL expression that makes the server return this column's canonical value over JDBC."""
        return self.select_template.format(c=quoted_column)

    def from_binlog(self, value: Any, none_source: str | None = None) -> Any:
        """Convert a python-mysql-replication value into the canonical Python value.

        ``none_source`` is pymysqlreplication's ``none_sources[column]`` for that row image: the
        decoder returns ``None`` for an empty SET and says ``"empty set"`` there. Without it an
        empty SET of a nullable column cannot be told from NULL (it is taken as NULL); a NOT NULL
        SET column's ``None`` is always the empty set.
        """
        if value is None:
            if self._empty_set_is_none and (none_source == "empty set" or self._not_null):
                return ""
            return None
        return self._from_binlog(value)


# --------------------------------------------------------------------------- value converters
def _identity(v: Any) -> Any:
    return v


def _as_int(v: Any) -> int:
    return int(v)


def _as_float(v: Any) -> float:
    return float(v)


def _as_decimal_int(v: Any) -> Decimal:
    return Decimal(int(v))


def _decimal_converter(scale: int) -> Callable[[Any], Decimal]:
    quantum = Decimal(1).scaleb(-scale)

    def conv(v: Any) -> Decimal:
        return Decimal(v).quantize(quantum, context=_DEC_CONTEXT)

    return conv


def _decimal_text_converter(scale: int) -> Callable[[Any], str]:
    """DECIMAL beyond decimal128: the text ``CAST(d AS CHAR)`` gives (``0E-30`` -> ``0.000...``)."""
    quantum = Decimal(1).scaleb(-scale)

    def conv(v: Any) -> str:
        return format(Decimal(v).quantize(quantum, context=_DEC_CONTEXT), "f")

    return conv


def _datetime_converter(v: Any) -> dt.datetime | None:
    """DATETIME: the wall time, labelled UTC (the decoder already maps zero dates to None)."""
    if isinstance(v, dt.datetime):
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)
    raise TypeError(f"expected a datetime from the binlog, got {type(v).__name__}: {v!r}")


def _timestamp_converter(v: Any) -> dt.datetime | None:
    """TIMESTAMP: the decoder gives the naive UTC instant; the zero TIMESTAMP decodes as the epoch.

    TIMESTAMP's range starts at 1970-01-01 00:00:01 UTC, so exactly the epoch can only be the zero
    value '0000-00-00 00:00:00' (stored as 0), which JDBC reads as NULL.
    """
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            if v == _EPOCH:
                return None
            return v.replace(tzinfo=UTC)
        return v.astimezone(UTC)
    raise TypeError(f"expected a datetime from the binlog, got {type(v).__name__}: {v!r}")


def _date_converter(v: Any) -> dt.date:
    if isinstance(v, dt.datetime):
        return v.date()
    if isinstance(v, dt.date):
        return v
    raise TypeError(f"expected a date from the binlog, got {type(v).__name__}: {v!r}")


def format_time(value: dt.timedelta, fsp: int) -> str:
    """``[-]H+:MM:SS[.f]`` with exactly ``fsp`` fraction digits — what ``CAST(t AS CHAR)`` prints."""
    total = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    sign = "-" if total < 0 else ""
    total = abs(total)
    secs, micros = divmod(total, 1_000_000)
    hours, rem = divmod(secs, 3600)
    minutes, seconds = divmod(rem, 60)
    text = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
    if fsp > 0:
        text += "." + f"{micros:06d}"[:fsp]
    return text


def _repair_negative_time(value: dt.timedelta) -> dt.timedelta:
    """Undo mysql-replication's TIME2 decoding of negative values with a fraction.

    The server stores ``-(H + f)`` as integer part ``-(H+1)`` and fraction ``1 - f`` (two's
    complement over the whole packed value); the decoder negates the parts separately and returns
    ``-(H + 1 - f)``. The true value is recoverable: ``H = floor(|v|)``, ``f = 1 - frac(|v|)``.
    Negative values without a fraction and all positive values are decoded correctly.
    """
    if value >= dt.timedelta(0) or value.microseconds == 0:
        return value
    mag = -value
    whole = dt.timedelta(days=mag.days, seconds=mag.seconds)
    frac = mag - whole
    return -(whole + (dt.timedelta(seconds=1) - frac))


@functools.lru_cache(maxsize=1)
def _binlog_misdecodes_negative_time() -> bool:
    """Ask the installed decoder how it reads ``-00:00:01.10`` (TIME(2), bytes 7F FF FE F6).

    The bytes are the server's own encoding (MySQL ``my_time_packed_to_binary``, same in
    MariaDB). mysql-replication 1.0.17 returns -1.9 s. Probing instead of pinning the version
    means a fixed decoder is used as it is, and an unknown third answer stops with an error
    rather than writing wrong values.
    """
    from pymysqlreplication.column import Column
    from pymysqlreplication.constants import FIELD_TYPE
    from pymysqlreplication.packet import BinLogPacketWrapper
    from pymysqlreplication.row_event import RowsEvent

    class _Bytes(BinLogPacketWrapper):
        def __init__(self, data: bytes):  # no socket: just the bytes of one value
            self._data = data
            self.read_bytes = 0

        def read(self, size: int) -> bytes:
            size = int(size)
            out, self._data = self._data[:size], self._data[size:]
            return out

    event = object.__new__(RowsEvent)
    event.packet = _Bytes(bytes.fromhex("7ffffef6"))
    got = event._RowsEvent__read_time2(Column(type=FIELD_TYPE.TIME2, fsp=2))  # type: ignore[attr-defined]
    truth = -dt.timedelta(seconds=1, microseconds=100_000)
    if got == truth:
        return False
    if got == -dt.timedelta(seconds=1, microseconds=900_000):
        return True
    raise RuntimeError(
        f"the installed mysql-replication decodes TIME '-00:00:01.10' as {got!r}, neither the known bug "
        "nor the right value: re-run tests/integration/test_type_fidelity.py and fix cdc/types.py"
    )


def _time_converter(fsp: int) -> Callable[[Any], str]:
    repair = _binlog_misdecodes_negative_time()

    def conv(v: Any) -> str:
        if isinstance(v, dt.timedelta):
            return format_time(_repair_negative_time(v) if repair else v, fsp)
        if isinstance(v, dt.time):
            return format_time(dt.timedelta(hours=v.hour, minutes=v.minute, seconds=v.second,
                                            microseconds=v.microsecond), fsp)
        raise TypeError(f"expected a timedelta from the binlog, got {type(v).__name__}: {v!r}")

    return conv


def _year_converter(v: Any) -> int:
    """The decoder adds 1900 to the stored byte, so YEAR 0000 (stored 0) arrives as 1900.

    1900 is not a valid YEAR (the range is 1901..2155 plus 0000), so 1900 can only be 0000.
    """
    y = int(v)
    return 0 if y == 1900 else y


def _text_converter(charset: str | None) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        if isinstance(v, str):
            return v
        if isinstance(v, bytes | bytearray):
            # The decoder hands back raw bytes for charsets Python lacks a codec name for.
            return bytes(v).decode(_python_codec(charset))
        raise TypeError(f"expected text from the binlog, got {type(v).__name__}: {v!r}")

    return conv


def _python_codec(charset: str | None) -> str:
    cs = (charset or "utf8mb4").lower()
    return {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": "cp1252", "ascii": "ascii",
            "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be",
            "binary": "latin-1"}.get(cs, cs)


def _bytes_converter(pad_to: int | None) -> Callable[[Any], bytes]:
    """Binary values: the decoder gives ``str`` '' for an empty value (``b''.decode('binary')``
    skips the codec lookup), and drops BINARY(n)'s trailing 0x00 bytes, which we put back."""

    def conv(v: Any) -> bytes:
        if isinstance(v, str):
            if v:
                raise TypeError(f"expected bytes from the binlog for a binary column, got text {v!r}")
            b = b""
        else:
            b = bytes(v)
        if pad_to is not None and len(b) < pad_to:
            b = b + b"\x00" * (pad_to - len(b))
        return b

    return conv


def _enum_converter(labels: list[str]) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        if isinstance(v, str):
            return v
        if isinstance(v, int):  # a decoder without metadata: 1-based index, 0 = the '' error value
            return "" if v == 0 else labels[v - 1]
        if isinstance(v, bytes):
            return v.decode("utf-8")
        raise TypeError(f"expected an ENUM label from the binlog, got {type(v).__name__}: {v!r}")

    return conv


def _set_converter(labels: list[str]) -> Callable[[Any], str]:
    order = {label: i for i, label in enumerate(labels)}
    folded = {label.lower(): label for label in labels}

    def conv(v: Any) -> str:
        if isinstance(v, str):
            members = [m for m in v.split(",") if m] if v else []
        elif isinstance(v, int):
            members = [label for i, label in enumerate(labels) if v & (1 << i)]
        elif isinstance(v, set | frozenset | list | tuple):
            members = [m.decode("utf-8") if isinstance(m, bytes) else str(m) for m in v]
        else:
            raise TypeError(f"expected SET members from the binlog, got {type(v).__name__}: {v!r}")
        canon = [m if m in order else folded.get(m.lower(), m) for m in members]
        return ",".join(sorted(canon, key=lambda m: order.get(m, len(order))))

    return conv


def _bit_int(v: Any) -> int:
    """The decoder renders BIT as a string of '0'/'1' (most significant first)."""
    if isinstance(v, str):
        return int(v, 2) if v else 0
    if isinstance(v, bytes | bytearray):
        return int.from_bytes(v, "big")
    if isinstance(v, bool | int):
        return int(v)
    raise TypeError(f"expected BIT bits from the binlog, got {type(v).__name__}: {v!r}")


def _bit_bool(v: Any) -> bool:
    return _bit_int(v) != 0


def _bit_decimal(v: Any) -> Decimal:
    return Decimal(_bit_int(v))


def _json_converter(v: Any) -> str:
    """MariaDB JSON is LONGTEXT: the decoder gives the stored text, which JDBC gives too.

    MySQL 8 stores binary JSON; the decoder parses it into Python objects (strings as bytes).
    Rendering follows MySQL's own output (``", "`` and ``": "`` separators, no ASCII escaping,
    keys in stored order). Untested here (no MySQL 8 server on this stack): doubles may print
    differently from MySQL (``1e+20`` vs ``1e20``).
    """
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if type(v).__name__ == "JsonDiff":
        raise ValueError(
            "the binlog holds a partial JSON update, which cannot be turned into a value: "
            "SET GLOBAL binlog_row_value_options='' on the source (full JSON images)"
        )
    return json.dumps(_json_plain(v), ensure_ascii=False, separators=(", ", ": "))


def _json_plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, dict):
        return {_json_plain(k): _json_plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_plain(x) for x in v]
    if isinstance(v, Decimal):
        return float(v) if v != v.to_integral_value() else int(v)
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat(sep=" ") if isinstance(v, dt.datetime) else v.isoformat()
    return v


# --------------------------------------------------------------------------- the mapping
def _zero_date_guard(value: str) -> str:
    """``value`` unless ``{c}`` is a zero or partial-zero date (NULL then): the driver rolls
    ``2024-00-15`` over to ``2023-12-15``, and year 0 is no date the lakehouse can hold."""
    return "IF(YEAR({c}) = 0 OR MONTH({c}) = 0 OR DAYOFMONTH({c}) = 0, NULL, " + value + ")"


_ZERO_DATE_GUARD = _zero_date_guard("{c}")


def column_type(col: ColumnInfo) -> ColumnType:
    """The canonical type of one column (see the module docstring for the table and reasons)."""
    t = col.data_type.lower()
    ct = col.column_type.lower()

    def make(
        kind: str, arrow: pa.DataType, spark: str, select: str, conv: Callable[[Any], Any], **kw: Any
    ) -> ColumnType:
        return ColumnType(col.name, col.column_type, kind, arrow, spark, select, conv, **kw)

    if t in _SIGNED_INT:
        arrow, spark = (_UNSIGNED_INT if col.unsigned else _SIGNED_INT)[t]
        if pa.types.is_decimal(arrow):
            return make("uint64", arrow, spark, "{c}", _as_decimal_int)
        return make("int", arrow, spark, "{c}", _as_int)
    if t == "year":
        # CAST keeps YEAR numeric even if a caller drops yearIsDateType=false from the URL.
        return make("year", pa.int16(), "SMALLINT", "CAST({c} AS SIGNED)", _year_converter)
    if t in ("decimal", "numeric"):
        p = col.numeric_precision or 10
        s = col.numeric_scale or 0
        if p <= _MAX_DECIMAL128:
            return make("decimal", pa.decimal128(p, s), f"DECIMAL({p},{s})", "{c}", _decimal_converter(s))
        return make("decimal_text", pa.string(), "STRING", "CAST({c} AS CHAR)", _decimal_text_converter(s))
    if t == "float":
        # The text protocol prints FLOAT with 6 significant digits (16777216 -> 16777200); a DOUBLE
        # prints all of them, and Connector/J's getFloat (customSchema FLOAT) parses that text
        # with Float.valueOf to the nearest float, which is the stored one.
        return make("float", pa.float32(), "FLOAT", "CAST({c} AS DOUBLE)", _as_float)
    if t in ("double", "real"):
        return make("double", pa.float64(), "DOUBLE", "{c}", _as_float)
    if t == "datetime":
        return make("datetime", pa.timestamp("us", tz="UTC"), "TIMESTAMP", _ZERO_DATE_GUARD, _datetime_converter)
    if t == "timestamp":
        return make("timestamp", pa.timestamp("us", tz="UTC"), "TIMESTAMP", _ZERO_DATE_GUARD, _timestamp_converter)
    if t == "date":
        return make("date", pa.date32(), "DATE", _ZERO_DATE_GUARD, _date_converter)
    if t == "time":
        fsp = col.datetime_precision or 0
        # Connector/J 2.7 rejects TIME outside 00..23 h ("Time format ... incorrect"): read text.
        return make("time", pa.string(), "STRING", "CAST({c} AS CHAR)", _time_converter(fsp))
    if t in _TEXT:
        if (col.charset or "").lower() == "binary":  # e.g. VARCHAR(..) CHARACTER SET binary
            return make("bytes", pa.binary(), "BINARY", "{c}", _bytes_converter(None))
        if t == "json":
            return make("json", pa.string(), "STRING", "{c}", _json_converter)
        # CHAR: Spark maps a JDBC CHAR(n) column to CharType and pads it back to n on read
        # (spark.sql.readSideCharPadding), although MySQL strips the trailing spaces; CAST(.. AS
        # CHAR) is a VARCHAR, which Spark leaves alone.
        select = "CAST({c} AS CHAR)" if t == "char" else "{c}"
        return make("string", pa.string(), "STRING", select, _text_converter(col.charset))
    if t in _BYTES:
        pad = col.char_max_length if t == "binary" else None
        return make("bytes", pa.binary(), "BINARY", "{c}", _bytes_converter(pad))
    if t == "enum":
        # The driver reports ENUM/SET as CHAR(longest value): read as VARCHAR (see CHAR above).
        return make("enum", pa.string(), "STRING", "CAST({c} AS CHAR)", _enum_converter(enum_values(col.column_type)))
    if t == "set":
        return make("set", pa.string(), "STRING", "CAST({c} AS CHAR)", _set_converter(enum_values(col.column_type)),
                    _empty_set_is_none=True, _not_null=not col.nullable)
    if t == "bit":
        m = re.match(r"bit\s*\((\d+)\)", ct)
        bits = int(m.group(1)) if m else (col.numeric_precision or 1)
        if bits == 1:
            return make("bit1", pa.bool_(), "BOOLEAN", "{c}", _bit_bool)
        if bits <= 63:
            return make("bit", pa.int64(), "BIGINT", "CAST({c} AS UNSIGNED)", _bit_int)
        return make("bit64", pa.decimal128(20, 0), "DECIMAL(20,0)", "CAST({c} AS UNSIGNED)", _bit_decimal)
    if t in _GEOMETRY:
        # Lossless: MySQL's internal value (4-byte little-endian SRID, then WKB) on both paths.
        return make("geometry", pa.binary(), "BINARY", "{c}", _bytes_converter(None))
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


_SMALL_DOMAIN_KINDS = {"year", "enum", "set", "bit1"}


def dictionary_columns(table_schema: TableSchema) -> list[str]:
    """Columns whose staged Parquet pages keep dictionary encoding: types with a small domain.

    Why not all: a dictionary costs the writer a hash lookup per value and is discarded anyway
    once it outgrows its page, which is what keys, amounts, timestamps and free text do. Measured
    on the 2M-row benchmark table (bench/RESULTS.md): the Spark staging write ran ~10-15 % faster
    without it and the files were no larger. Types whose values come from a short list (TINYINT,
    YEAR, ENUM, SET, BIT(1..16)) keep it: cheap to build and it shrinks them several-fold.
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


# --------------------------------------------------------------------------- native (Arrow) reader
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
        out.append(f"{template.format(c=q) if template else ct.select_expr(q)} AS {q}")
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


def _spark_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def spark_schema_ddl(table_schema: TableSchema) -> str:
    """The canonical Spark schema of the table: ``\\`a\\` INT, ...`` (what :func:`jdbc_read`'s
    frame holds; the staged Parquet written from it has :func:`arrow_schema`)."""
    return ", ".join(f"{_spark_ident(ct.name)} {ct.spark_ddl}" for ct in column_types(table_schema))


def select_list(table_schema: TableSchema) -> str:
    """The SELECT list that reads every column as its canonical value: ``expr AS `name`, ...``.

    For clients that decode MySQL values themselves (pymysql in ``verify``, and the base of
    :func:`native_select_list`); Spark's JDBC reader needs :func:`jdbc_read` instead.
    """
    out = []
    for ct in column_types(table_schema):
        q = quote_ident(ct.name)
        out.append(f"{ct.select_expr(q)} AS {q}")
    return ", ".join(out)


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
        template, read_type, finish = _JDBC_INTEGER_FORMS.get(ct.kind, (ct.select_template, ct.spark_ddl, "{c}"))
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


RowConverter = Callable[..., dict[str, Any]]


def binlog_row_converter(table_schema: TableSchema, added_columns: Iterable[str] = ()) -> RowConverter:
    """``convert(values, none_sources=None) -> row`` for one table's binlog row images.

    ``values`` is a pymysqlreplication image (``row["values"]``, ``row["before_values"]`` or
    ``row["after_values"]``), keyed by column name (needs ``binlog_row_metadata=FULL``).
    ``none_sources`` is the matching ``row["none_sources"]`` / ``before_none_sources`` /
    ``after_none_sources``; pass it so an empty SET is not mistaken for NULL.

    A missing column (MINIMAL row image, or the table changed since ``table_schema`` was read)
    raises ``ValueError`` naming it: guessing would write NULLs over real data. The exception is
    ``added_columns``: columns the stream added to the table (ALTER TABLE ... ADD COLUMN) are NULL
    in images written before the ALTER, as they are in the sink's older rows.
    """
    cts = column_types(table_schema)
    plan = [(ct.name, ct.from_binlog) for ct in cts]
    names = {ct.name for ct in cts}
    optional = set(added_columns) & names

    def convert(values: Mapping[str, Any], none_sources: Mapping[str, str] | None = None) -> dict[str, Any]:
        if optional and not optional <= values.keys():
            values = {**dict.fromkeys(optional), **values}
        try:
            if none_sources:
                return {n: f(values[n], none_sources.get(n)) for n, f in plan}
            return {n: f(values[n]) for n, f in plan}
        except KeyError:
            missing = sorted(names - set(values))
            if not missing:
                raise
            raise ValueError(
                f"binlog row image of {table_schema.table} lacks columns {missing}: the source needs "
                "binlog_row_image=FULL and binlog_row_metadata=FULL, or the table's schema changed "
                "(re-read it)"
            ) from None

    return convert


def rows_to_arrow(rows: Iterable[Mapping[str, Any]], table_schema: TableSchema) -> pa.Table:
    """Canonical rows (from :func:`binlog_row_converter`) as an Arrow table with :func:`arrow_schema`."""
    schema = arrow_schema(table_schema)
    rows = list(rows)
    columns = [pa.array([r[f.name] for r in rows], type=f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


# --------------------------------------------------------------------------- JDBC
def jdbc_url(settings: Any, database: str | None = None) -> str:
    """``jdbc:mysql://host:port/[db]?<JDBC_URL_OPTIONS>`` for Connector/J 2.7 (MariaDB driver).

    ``jdbc:mysql:`` (not ``jdbc:mariadb:``) so the same URL also works against MySQL servers;
    Connector/J 2.x accepts it. TLS follows ``settings.ssl``: True -> ``useSsl=true`` (verifying
    against ``ssl_ca`` when given, else trusting the server certificate, as the PyMySQL path does);
    None/False -> no TLS (Connector/J 2.7 has no "use TLS if offered" mode).
    """
    db = database if database is not None else (getattr(settings, "database", None) or "")
    opts = dict(JDBC_URL_OPTIONS)
    if getattr(settings, "ssl", None) is True:
        opts["useSsl"] = "true"
        ca = getattr(settings, "ssl_ca", None)
        if ca:
            opts["serverSslCert"] = str(ca)
        else:
            opts["trustServerCertificate"] = "true"
    query = "&".join(f"{k}={v}" for k, v in opts.items())
    return f"jdbc:mysql://{settings.host}:{int(settings.port)}/{db}?{query}"


def jdbc_properties(settings: Any) -> dict[str, str]:
    """Connection properties for ``spark.read.jdbc``: login, the MariaDB driver class, timeout.

    The password travels in properties, not in the URL, so Spark's redacted URL logs never show it.
    """
    props = {
        "user": str(settings.user),
        "password": str(settings.password or ""),
        "driver": MARIADB_JDBC_DRIVER,
    }
    timeout = getattr(settings, "connect_timeout", None)
    if timeout:
        props["connectTimeout"] = str(int(timeout) * 1000)
    return props
