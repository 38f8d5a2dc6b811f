"""How each binlog column's bytes become its canonical value: one plan per column of a table map.

The rows decoder (``mysql/rows_decoder.py``) generates code from these plans; this module knows the
wire formats and the canonical values (``core/types.py``, docs/architecture.md, "Types and time
zones"). A column whose binlog type does not match the schema, or that has no exact decoder here,
raises :class:`UnsupportedRowFormat`.

Wire formats (MySQL ``Field::pack`` / ``log_event.cc``, identical in MariaDB 10.11): a row image is
a null bitmap over the present columns, then the non-null values in column order: integers
little-endian; FLOAT/DOUBLE IEEE little-endian; DECIMAL the packed big-endian base-10^9 format with
the sign in the top bit; DATETIME2 5 bytes + fraction, TIME2 3 bytes + fraction, TIMESTAMP2 4 bytes
+ fraction, all big-endian; DATE 3 bytes little-endian; strings a 1- or 2-byte length (BLOB family:
``length_size`` bytes) then the bytes; ENUM/SET 1-8 byte little-endian index/bitmask; BIT
big-endian bytes.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.table import ColumnInfo, enum_values
from airflow_provider_mysqlcdc.mysql import binlog_values, charsets

UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_DEC_CONTEXT = binlog_values._DEC_CONTEXT
_COMPRESSED_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_UTF8 = {"utf8mb4", "utf8mb3", "utf8"}


def _text_decoder(charset: str) -> str | Any:
    """'utf8' (decoded inline by the generated code) or a ``bytes -> str`` function decoding as the
    server does (``mysql/charsets.py``: a table learned from the server where Python's codec differs)."""
    if charset in _UTF8:
        return "utf8"
    try:
        return charsets.text_decoder(charset)
    except charsets.UnsupportedCharset as exc:
        raise UnsupportedRowFormat(str(exc)) from exc


_INT_SIZES = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.INT24: 3, FIELD_TYPE.LONG: 4,
              FIELD_TYPE.LONGLONG: 8}  # fmt: skip
_INT_TYPES = {"tinyint": FIELD_TYPE.TINY, "smallint": FIELD_TYPE.SHORT, "mediumint": FIELD_TYPE.INT24,
              "int": FIELD_TYPE.LONG, "integer": FIELD_TYPE.LONG, "bigint": FIELD_TYPE.LONGLONG}  # fmt: skip
_TEXT_BLOB = {"tinytext", "text", "mediumtext", "longtext", "json", "tinyblob", "blob", "mediumblob", "longblob"}


class UnsupportedRowFormat(ValueError):
    """This table map cannot be decoded exactly here; use python-mysql-replication for it."""


def _fsp_bytes(fsp: int) -> int:
    return (fsp + 1) // 2


def _frac_scale(fsp: int) -> int:
    """Microseconds per unit of the stored fraction (1-2 digits: 1/100 s, 3-4: 1/10000 s, 5-6: µs)."""
    return {0: 0, 1: 10000, 2: 10000, 3: 100, 4: 100, 5: 1, 6: 1}[fsp]


# ---------------------------------------------------------------------------- value decoders
# Each takes the value's bytes (exactly its stored size) and returns the canonical value.
def _decimal_decoder(precision: int, scale: int, as_text: bool) -> tuple[int, Any]:
    integral = precision - scale
    uncomp_int, comp_int = divmod(integral, 9)
    uncomp_frac, comp_frac = divmod(scale, 9)
    head = _COMPRESSED_BYTES[comp_int]
    tail = _COMPRESSED_BYTES[comp_frac]
    size = head + 4 * uncomp_int + 4 * uncomp_frac + tail
    groups = uncomp_int + uncomp_frac
    frac_mul = 10**comp_frac
    from_bytes = int.from_bytes
    # The value as ONE big-endian integer: the sign bit flipped (all bits for a negative value),
    # then the digit groups are bit fields of it — no byte copies, one int conversion per value.
    sign_bit = 0x80 << (8 * (size - 1))
    negative_flip = ((1 << (8 * size)) - 1) ^ sign_bit  # a negative value: every bit but the sign bit
    head_shift = 8 * (size - head)
    group_shifts = [8 * (size - head - 4 * (i + 1)) for i in range(groups)]
    tail_mask = (1 << (8 * tail)) - 1

    def dec(b: bytes) -> Any:
        x = from_bytes(b, "big")
        negative = not (x & sign_bit)
        x ^= negative_flip if negative else sign_bit
        value = x >> head_shift if head else 0
        for shift in group_shifts:
            value = value * 1_000_000_000 + ((x >> shift) & 0xFFFFFFFF)
        if tail:
            value = value * frac_mul + (x & tail_mask)
        d = Decimal(-value if negative else value).scaleb(-scale, _DEC_CONTEXT)
        return format(d, "f") if as_text else d

    return size, dec


def _datetime2_decoder(fsp: int) -> tuple[int, Any]:
    nfrac = _fsp_bytes(fsp)
    mul = _frac_scale(fsp)
    from_bytes = int.from_bytes
    datetime = dt.datetime

    def dec(b: bytes) -> Any:
        v = from_bytes(b[:5], "big") - 0x8000000000
        ymd = v >> 17
        ym = ymd >> 5
        hms = v & 0x1FFFF
        micro = from_bytes(b[5:], "big") * mul if nfrac else 0
        try:
            return datetime(ym // 13, ym % 13, ymd & 31, hms >> 12, (hms >> 6) & 63, hms & 63, micro, UTC)
        except ValueError:  # zero or partial-zero date: NULL, as over JDBC
            return None

    return 5 + nfrac, dec


def _timestamp2_decoder(fsp: int) -> tuple[int, Any]:
    nfrac = _fsp_bytes(fsp)
    mul = _frac_scale(fsp)
    from_bytes = int.from_bytes
    delta = dt.timedelta

    def dec(b: bytes) -> Any:
        secs = from_bytes(b[:4], "big")
        micro = from_bytes(b[4:], "big") * mul if nfrac else 0
        if secs == 0 and micro == 0:  # the zero TIMESTAMP (the range starts at 00:00:01 UTC)
            return None
        return _EPOCH + delta(seconds=secs, microseconds=micro)

    return 4 + nfrac, dec


def _time2_decoder(fsp: int) -> tuple[int, Any]:
    """TIME2 as MySQL's ``my_time_packed_from_binary`` reads it, then ``format_time``'s text."""
    nfrac = _fsp_bytes(fsp)
    from_bytes = int.from_bytes
    fmt = binlog_values.format_time
    delta = dt.timedelta

    def dec(b: bytes) -> str:
        if nfrac == 3:
            packed = from_bytes(b[:6], "big") - 0x800000000000
        else:
            intpart = from_bytes(b[:3], "big") - 0x800000
            if nfrac == 0:
                packed = intpart << 24
            else:
                frac = from_bytes(b[3:], "big")
                unit = 0x100 if nfrac == 1 else 0x10000
                if intpart < 0 and frac:
                    intpart += 1
                    frac -= unit
                packed = (intpart << 24) + frac * (10000 if nfrac == 1 else 100)
        negative = packed < 0
        if negative:
            packed = -packed
        hms = packed >> 24
        micro = packed & 0xFFFFFF
        value = delta(hours=(hms >> 12) & 0x3FF, minutes=(hms >> 6) & 63, seconds=hms & 63, microseconds=micro)
        return fmt(-value if negative else value, fsp)

    return 3 + nfrac, dec


def _date_decoder(b: bytes) -> Any:
    v = int.from_bytes(b, "little")
    day, month, year = v & 31, (v >> 5) & 15, v >> 9
    if not (year and month and day):
        return None
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def _enum_decoder(labels: list[str]) -> Any:
    table = ["", *labels]

    def dec(b: bytes) -> str:
        return table[int.from_bytes(b, "little")]

    return dec


def _set_decoder(labels: list[str]) -> Any:
    def dec(b: bytes) -> str:
        mask = int.from_bytes(b, "little")
        return ",".join(label for i, label in enumerate(labels) if mask >> i & 1)

    return dec


# ---------------------------------------------------------------------------- column plans
def column_plan(bcol: Any, info: ColumnInfo | None) -> tuple[str, Any, Any]:
    """``(layout, arg, convert)`` for one binlog column.

    layout: 'fixed' (arg = size, convert(bytes) -> value), 'int' (arg = (size, signed)),
    'float'/'double', 'var' (arg = length-prefix size, convert(bytes) -> value).
    ``info`` is None for a column the schema does not have (decoded only to skip it).
    """
    t = bcol.type
    ct = cdc_types.column_type(info) if info is not None else None
    kind = ct.kind if ct is not None else None

    def expect(*kinds: str) -> None:
        if ct is not None and kind not in kinds:
            raise UnsupportedRowFormat(f"column {bcol.name}: binlog type {t} does not match the schema kind {kind}")

    if t in _INT_SIZES:
        size = _INT_SIZES[t]
        if info is not None:
            want = _INT_TYPES.get(info.data_type.lower())
            if want != t or bool(bcol.unsigned) != info.unsigned:
                raise UnsupportedRowFormat(f"column {bcol.name}: binlog integer type differs from the schema")
        expect("int", "uint64")
        if kind == "uint64":
            return "int", (size, False), lambda v: Decimal(v)
        return "int", (size, not bcol.unsigned), None
    if t == FIELD_TYPE.YEAR:
        expect("year")
        return "fixed", 1, lambda b: b[0] + 1900 if b[0] else 0
    if t == FIELD_TYPE.FLOAT:
        expect("float")
        return "float", 4, None
    if t == FIELD_TYPE.DOUBLE:
        expect("double")
        return "double", 8, None
    if t == FIELD_TYPE.NEWDECIMAL:
        expect("decimal", "decimal_text")
        if info is not None and (bcol.precision, bcol.decimals) != (info.numeric_precision, info.numeric_scale or 0):
            raise UnsupportedRowFormat(f"column {bcol.name}: DECIMAL precision/scale differ from the schema")
        size, dec = _decimal_decoder(bcol.precision, bcol.decimals, kind == "decimal_text")
        return "fixed", size, dec
    if t == FIELD_TYPE.DATETIME2:
        expect("datetime")
        size, dec = _datetime2_decoder(bcol.fsp)
        return "fixed", size, dec
    if t == FIELD_TYPE.TIMESTAMP2:
        expect("timestamp")
        size, dec = _timestamp2_decoder(bcol.fsp)
        return "fixed", size, dec
    if t == FIELD_TYPE.TIME2:
        expect("time")
        if info is not None and bcol.fsp != (info.datetime_precision or 0):
            raise UnsupportedRowFormat(f"column {bcol.name}: TIME precision differs from the schema")
        size, dec = _time2_decoder(bcol.fsp)
        return "fixed", size, dec
    if t == FIELD_TYPE.DATE:
        expect("date")
        return "fixed", 3, _date_decoder
    if t == FIELD_TYPE.ENUM:
        expect("enum")
        return "fixed", bcol.size, _enum_decoder(_members(bcol, info, getattr(bcol, "enum_values", None), 1))
    if t == FIELD_TYPE.SET:
        expect("set")
        return "fixed", bcol.size, _set_decoder(_members(bcol, info, getattr(bcol, "set_values", None), 0))
    if t == FIELD_TYPE.BIT:
        expect("bit1", "bit", "bit64")
        conv: Any
        if kind == "bit1":
            conv = lambda b: int.from_bytes(b, "big") != 0  # noqa: E731
        elif kind == "bit64":
            conv = lambda b: Decimal(int.from_bytes(b, "big"))  # noqa: E731
        else:
            conv = lambda b: int.from_bytes(b, "big")  # noqa: E731
        return "fixed", bcol.bytes, conv
    if t in (FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING, FIELD_TYPE.BLOB, FIELD_TYPE.GEOMETRY):
        if t in (FIELD_TYPE.BLOB, FIELD_TYPE.GEOMETRY):
            prefix = bcol.length_size
        else:
            prefix = 2 if bcol.max_length > 255 else 1
        if ct is None:
            return "var", prefix, None
        if kind in ("string", "json"):
            cs = (info.charset or "").lower() if info is not None else ""
            return "var", prefix, _text_decoder(cs or "utf8mb4")
        if kind in ("bytes", "geometry"):
            pad = info.char_max_length if info is not None and info.data_type.lower() == "binary" else None
            if pad:
                return "var", prefix, lambda b, _n=pad: b.ljust(_n, b"\x00")
            return "var", prefix, "bytes"
        raise UnsupportedRowFormat(f"column {bcol.name}: binlog string type for schema kind {kind}")
    raise UnsupportedRowFormat(f"column {bcol.name}: binlog type {t} has no fast decoder")


def _members(bcol: Any, info: ColumnInfo | None, from_map: list[str] | None, skip: int) -> list[str]:
    """ENUM/SET member labels, in definition order.

    ``information_schema`` shows a 4-byte character of a member as '?', so for utf8 columns the
    labels come from the TABLE_MAP's metadata (binlog_row_metadata=FULL), which has them exactly.
    python-mysql-replication decodes those as UTF-8 and leaves '' where that fails, so for other
    character sets (which cannot hold 4-byte characters) the schema's labels are the exact ones.
    """
    cs = (info.charset or "").lower() if info is not None else ""
    schema_labels = enum_values(info.column_type) if info is not None else []
    if from_map is not None and (cs in _UTF8 or info is None):
        labels = list(from_map[skip:])
        if info is not None and len(labels) != len(schema_labels):
            raise UnsupportedRowFormat(f"column {bcol.name}: the binlog's members differ from the schema's")
        return labels
    return schema_labels


__all__ = ["UnsupportedRowFormat", "column_plan"]
