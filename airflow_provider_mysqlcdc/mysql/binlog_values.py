"""Binlog row images as canonical values: the binlog path's adapter to the type table.

python-mysql-replication (and ``mysql/rows_decoder.py``, which reuses the converters here for the
few kinds it does not decode itself) hand out Python values in the library's own forms: a TIME as a
timedelta (negative ones with a fraction mis-decoded), YEAR 0000 as 1900, BIT as a bit string, a
zero TIMESTAMP as the epoch, an empty SET as None ... Each converter turns one kind's values into
the value the snapshot readers produce for it (``core/types.py``, ``docs/types.md``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.core.types import ColumnType, column_types
from airflow_provider_mysqlcdc.mysql import charsets

UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1)
_DEC_CONTEXT = decimal.Context(prec=100)


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
        "nor the right value: re-run tests/integration/test_type_fidelity.py and fix core/types.py"
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
    """Text as the server decodes it: the reader hands the library's text columns over as raw bytes
    (``mysql/table_maps``), decoded here by ``mysql/charsets`` (Python's codec of a charset's name is
    often another definition)."""
    decoder: list[Callable[[bytes], str]] = []

    def conv(v: Any) -> str:
        if isinstance(v, str):
            return v
        if isinstance(v, bytes | bytearray):
            if not decoder:
                decoder.append(charsets.text_decoder(charset))
            return decoder[0](bytes(v))
        raise TypeError(f"expected text from the binlog, got {type(v).__name__}: {v!r}")

    return conv


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
    """MySQL's binary JSON, rendered as MySQL renders it (MariaDB's JSON is LONGTEXT: a string column).

    The decoder parses the binary form into Python objects, strings as bytes — a document that is
    one string too, which is JSON text only once quoted (``"abc"``, as MySQL returns it). Rendering
    follows MySQL's own output: ``", "`` and ``": "`` separators, no ASCII escaping, keys in stored
    order.
    """
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


def _by_kind(ct: ColumnType) -> Callable[[Any], Any]:
    k = ct.kind
    simple: dict[str, Callable[[Any], Any]] = {
        "int": _as_int, "uint64": _as_decimal_int, "year": _year_converter, "float": _as_float,
        "double": _as_float, "datetime": _datetime_converter, "timestamp": _timestamp_converter,
        "date": _date_converter, "json": _json_converter, "bit1": _bit_bool, "bit": _bit_int,
        "bit64": _bit_decimal,
    }  # fmt: skip
    if k in simple:
        return simple[k]
    if k == "decimal":
        return _decimal_converter(ct.scale)
    if k == "decimal_text":
        return _decimal_text_converter(ct.scale)
    if k == "time":
        return _time_converter(ct.fsp)
    if k == "string":
        return _text_converter(ct.charset)
    if k in ("bytes", "geometry"):
        return _bytes_converter(ct.pad_to)
    if k == "enum":
        return _enum_converter(list(ct.labels))
    if k == "set":
        return _set_converter(list(ct.labels))
    raise ValueError(f"no binlog converter for kind {k!r} of column {ct.name!r}")


def binlog_converter(ct: ColumnType) -> Callable[..., Any]:
    """``convert(value, none_source=None)``: one column's python-mysql-replication value, canonical.

    ``none_source`` is pymysqlreplication's ``none_sources[column]`` for that row image: the
    decoder returns ``None`` for an empty SET and says ``"empty set"`` there. Without it an empty
    SET of a nullable column cannot be told from NULL (it is taken as NULL); a NOT NULL SET
    column's ``None`` is always the empty set.
    """
    fn = _by_kind(ct)
    empty_set = ct.kind == "set"
    not_null = not ct.nullable

    def convert(value: Any, none_source: str | None = None) -> Any:
        if value is None:
            if empty_set and (none_source == "empty set" or not_null):
                return ""
            return None
        return fn(value)

    return convert


RowConverter = Callable[..., dict[str, Any]]


def binlog_row_converter(
    table_schema: TableSchema, added_columns: Iterable[str] = (), added_defaults: Mapping[str, Any] | None = None
) -> RowConverter:
    """``convert(values, none_sources=None) -> row`` for one table's binlog row images.

    ``values`` is a pymysqlreplication image (``row["values"]``, ``row["before_values"]`` or
    ``row["after_values"]``), keyed by column name (needs ``binlog_row_metadata=FULL``).
    ``none_sources`` is the matching ``row["none_sources"]`` / ``before_none_sources`` /
    ``after_none_sources``; pass it so an empty SET is not mistaken for NULL.

    A missing column (MINIMAL row image, or the table changed since ``table_schema`` was read)
    raises ``ValueError`` naming it: guessing would write NULLs over real data. The exception is
    ``added_columns``: columns the stream added to the table (ALTER TABLE ... ADD COLUMN) are NULL
    in images written before the ALTER, or the canonical value ``added_defaults`` gives (the value
    the ADD COLUMN gave the rows that existed).
    """
    cts = column_types(table_schema)
    plan = [(ct.name, binlog_converter(ct)) for ct in cts]
    names = {ct.name for ct in cts}
    optional = set(added_columns) & names
    defaults = {n: v for n, v in (added_defaults or {}).items() if n in optional and v is not None}

    def convert(values: Mapping[str, Any], none_sources: Mapping[str, str] | None = None) -> dict[str, Any]:
        absent = optional - values.keys() if optional else ()
        if absent:
            values = {**dict.fromkeys(absent), **values}
        try:
            if none_sources:
                row = {n: f(values[n], none_sources.get(n)) for n, f in plan}
            else:
                row = {n: f(values[n]) for n, f in plan}
        except KeyError:
            missing = sorted(names - set(values))
            if not missing:
                raise
            raise ValueError(
                f"binlog row image of {table_schema.table} lacks columns {missing}: the source needs "
                "binlog_row_image=FULL and binlog_row_metadata=FULL, or the table's schema changed "
                "(re-read it)"
            ) from None
        for n in absent:
            if n in defaults:
                row[n] = defaults[n]
        return row

    return convert
