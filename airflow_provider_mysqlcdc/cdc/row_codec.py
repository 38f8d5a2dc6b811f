"""One row image as a compact JSON string, and back to the exact typed values.

The streaming source has one fixed Spark schema for every captured table (DESIGN §3 "Stream
handoff": a micro-batch mixes tables), so a row image cannot travel as typed Spark columns. It
travels as text: a JSON object ``{"column": value, ...}`` in the table's column order. The sink
decodes it with the table's Arrow schema (:func:`cdc.types.arrow_schema`), which is what makes the
round trip exact where JSON alone is not:

==========================  ==========================  ===========================================
canonical Python value      JSON                        why
==========================  ==========================  ===========================================
None / bool / int / str     null / true,false / n / ""  native; ``int`` is arbitrary precision here
float                       number (shortest repr)      ``repr`` round-trips every float64 exactly;
                                                        a float32 value is a float64 exactly too
float NaN, +inf, -inf       "NaN" / "Infinity" /        not valid JSON numbers (``json`` would write
                            "-Infinity"                 a bare ``NaN`` other parsers reject)
Decimal                     "123.4500"                  text keeps every digit (decimal(20,0) near
                                                        2^64 does not fit a double or a long)
bytes                       base64 text                 JSON strings cannot hold 0x00..0xFF bytes
datetime                    "2026-01-02T03:04:05.12+00:00"  ISO 8601, always in UTC (naive = UTC)
date                        "2026-01-02"                ISO 8601
==========================  ==========================  ===========================================

Encoding dispatches on the Python type; decoding is driven by the schema, so a string column that
holds ``"NaN"`` or base64-looking text stays text. Pure: imports pyarrow, never pyspark.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

import pyarrow as pa

UTC = dt.UTC

_NAN = "NaN"
_POS_INF = "Infinity"
_NEG_INF = "-Infinity"


def _default(value: Any) -> Any:
    """The JSON form of the non-native canonical values (called by the C encoder only for those)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        else:
            value = value.astimezone(UTC)
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"row_codec cannot encode a {type(value).__name__} value: {value!r}")


# One encoder, reused: ``encode`` takes the C fast path (no indent), ``allow_nan=False`` makes a
# non-finite float fail loudly instead of writing invalid JSON; the slow path below handles it.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_default)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return _NAN
        return _POS_INF if value > 0 else _NEG_INF
    return value


def encode_row(row: Mapping[str, Any] | None) -> str | None:
    """``{"col": value}`` canonical row (from :func:`cdc.types.binlog_row_converter`) -> compact JSON.

    None stays None (the missing image of an insert or a delete).
    """
    if row is None:
        return None
    try:
        return _ENCODER.encode(row)
    except ValueError:
        # A NaN or an infinity somewhere (rare): spell those out and encode again.
        return _ENCODER.encode({k: _finite(v) for k, v in row.items()})


# --------------------------------------------------------------------------- decoding
Decoder = Callable[[Any], Any]


def _float(v: Any) -> float:
    if isinstance(v, str):
        if v == _NAN:
            return math.nan
        if v == _POS_INF:
            return math.inf
        if v == _NEG_INF:
            return -math.inf
        raise ValueError(f"not a float: {v!r}")
    return float(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"not an integer: {v!r}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"not a boolean: {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"not a string: {v!r}")
    return v


def _decimal(v: Any) -> Decimal:
    # Text is the encoding; an int is accepted too (a hand-written or older row).
    if isinstance(v, bool) or not isinstance(v, str | int):
        raise ValueError(f"not a decimal: {v!r}")
    return Decimal(v)


def _bytes(v: Any) -> bytes:
    return base64.b64decode(_str(v), validate=True)


def _timestamp(tz: str | None) -> Decoder:
    def conv(v: Any) -> dt.datetime:
        t = dt.datetime.fromisoformat(_str(v))
        if tz is None:  # a naive Arrow timestamp: naive wall time in UTC
            return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo is not None else t
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        return t.astimezone(UTC)

    return conv


def _date(v: Any) -> dt.date:
    return dt.date.fromisoformat(_str(v))


def _none(v: Any) -> None:
    if v is not None:
        raise ValueError(f"a null-typed column holds {v!r}")
    return None


def _decoder_for(t: pa.DataType) -> Decoder:
    if pa.types.is_boolean(t):
        return _bool
    if pa.types.is_integer(t):
        return _int
    if pa.types.is_floating(t):
        return _float
    if pa.types.is_decimal(t):
        return _decimal
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _str
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return _bytes
    if pa.types.is_timestamp(t):
        return _timestamp(t.tz)
    if pa.types.is_date(t):
        return _date
    if pa.types.is_null(t):
        return _none
    raise TypeError(f"row_codec has no decoding for Arrow type {t}")


class RowDecoder:
    """Decodes row_codec JSON of one table into canonical Python values, typed by its Arrow schema.

    Built once per schema (the per-column decoders are looked up once, not per row). A column the
    text lacks decodes as None — rows written before a column was added; a key the schema lacks
    raises, because dropping it would lose data silently.
    """

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self._plan = [(f.name, _decoder_for(f.type)) for f in schema]
        self._names = frozenset(f.name for f in schema)

    def decode(self, text: str | None) -> dict[str, Any] | None:
        if text is None:
            return None
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a row_codec row is a JSON object, got {type(raw).__name__}")
        extra = raw.keys() - self._names
        if extra:
            unknown = sorted(extra)
            raise ValueError(
                f"row has columns {unknown} that the table schema lacks: the schema is out of date "
                "(re-read the table schema / manifest)"
            )
        out: dict[str, Any] = {}
        for name, conv in self._plan:
            v = raw.get(name)
            try:
                out[name] = None if v is None else conv(v)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"column {name!r}: cannot decode {v!r}: {exc}") from None
        return out

    def to_arrow(self, texts: Iterable[str]) -> pa.Table:
        """Rows (no None entries) as an Arrow table with exactly :attr:`schema`."""
        rows = [self.decode(t) for t in texts]
        columns = [pa.array([r[f.name] for r in rows if r is not None], type=f.type) for f in self.schema]
        return pa.Table.from_arrays(columns, schema=self.schema)


@functools.lru_cache(maxsize=64)
def _cached_decoder(schema: pa.Schema) -> RowDecoder:
    return RowDecoder(schema)


def decode_row(text: str | None, schema: pa.Schema) -> dict[str, Any] | None:
    """Decode one row; the decoder for ``schema`` is cached, so calling this per row stays cheap."""
    return _cached_decoder(schema).decode(text)
