"""row_codec: every Arrow type of the canonical mapping survives JSON text exactly (DESIGN §4 values).

The stream carries row images as text (one schema for all tables), so a value that changes on the
way — a decimal near 2^64 rounded through a double, a 0x00 byte lost, a NaN turned into invalid
JSON, a timestamp shifted by a zone — would reach the sink wrong. Each case round-trips the value
and then builds Arrow with the table's schema, as the sink does.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_mysqlcdc.cdc.row_codec import RowDecoder, decode_row, encode_row

UTC = dt.UTC

CASES: list[tuple[str, pa.DataType, list[Any]]] = [
    ("int8", pa.int8(), [-128, 0, 127]),
    ("int16", pa.int16(), [-32768, 32767, 1901]),
    ("int32", pa.int32(), [-(2**31), 2**31 - 1]),
    ("int64", pa.int64(), [-(2**63), 2**63 - 1, 2**53 + 1]),  # 2^53+1 is not a double
    ("dec_u64", pa.decimal128(20, 0), [Decimal(2**64 - 1), Decimal(2**64 - 2), Decimal(0), Decimal(2**53 + 1)]),
    ("dec", pa.decimal128(12, 4), [Decimal("-12345678.1234"), Decimal("0.0000"), Decimal("1.5000")]),
    ("dec38", pa.decimal128(38, 10), [Decimal("9999999999999999999999999999.9999999999")]),
    ("f32", pa.float32(), [1.100000023841858, -0.0, 3.4028234663852886e38, 1.401298464324817e-45]),
    ("f64", pa.float64(), [0.1, -1e308, 5e-324, 2.0**53 + 2, -0.0]),
    ("ts", pa.timestamp("us", tz="UTC"), [
        dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
        dt.datetime(1000, 1, 1, tzinfo=UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
    ]),
    ("d", pa.date32(), [dt.date(1000, 1, 1), dt.date(9999, 12, 31), dt.date(1970, 1, 1), dt.date(1, 1, 1)]),
    ("s", pa.string(), ["", "plain", "emoji 😀 ünïcødé 漢字", "NaN", "AAEC", 'quote " \\ \n \t \x00', "00:00:01.10"]),
    ("b", pa.binary(), [b"", b"\x00", b"\x00\x01\xff\x00", bytes(range(256)), b"text"]),
    ("flag", pa.bool_(), [True, False]),
    ("nothing", pa.null(), [None]),
]


@pytest.mark.parametrize(("name", "atype", "values"), CASES, ids=[c[0] for c in CASES])
def test_round_trip_is_exact_and_arrow_accepts_it(name: str, atype: pa.DataType, values: list[Any]) -> None:
    schema = pa.schema([pa.field("id", pa.int32()), pa.field(name, atype)])
    decoder = RowDecoder(schema)
    texts = []
    for i, v in enumerate([*values, None]):
        row = {"id": i, name: v}
        text = encode_row(row)
        assert text is not None
        json.loads(text)  # strict JSON (no bare NaN)
        back = decoder.decode(text)
        assert back == row, (text, back)
        assert [type(x) for x in back.values()] == [type(x) for x in row.values()]
        if isinstance(v, float):
            assert math.copysign(1.0, back[name]) == math.copysign(1.0, v)  # -0.0 keeps its sign
        texts.append(text)
    table = decoder.to_arrow(texts)
    assert table.schema == schema
    assert table.column(name).to_pylist() == [*values, None]


def test_float_specials_are_valid_json_and_come_back() -> None:
    schema = pa.schema([pa.field("f", pa.float64()), pa.field("g", pa.float32()), pa.field("s", pa.string())])
    for v in (math.nan, math.inf, -math.inf):
        text = encode_row({"f": v, "g": v, "s": "x"})
        assert text is not None and "NaN" not in text.replace('"NaN"', "")  # only the quoted form
        json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))
        back = decode_row(text, schema)
        assert back is not None
        for k in ("f", "g"):
            assert (math.isnan(back[k]) and math.isnan(v)) or back[k] == v
        assert back["s"] == "x"
    # a string column holding "NaN" stays the string
    assert decode_row(encode_row({"f": 1.0, "g": 2.0, "s": "NaN"}), schema) == {"f": 1.0, "g": 2.0, "s": "NaN"}


def test_timestamps_are_written_in_utc_whatever_zone_they_carry() -> None:
    schema = pa.schema([pa.field("t", pa.timestamp("us", tz="UTC"))])
    plus2 = dt.timezone(dt.timedelta(hours=2))
    text = encode_row({"t": dt.datetime(2026, 5, 1, 12, 0, tzinfo=plus2)})
    assert text == '{"t":"2026-05-01T10:00:00+00:00"}'
    naive = encode_row({"t": dt.datetime(2026, 5, 1, 12, 0)})  # canonical values are UTC: naive = UTC
    assert naive == '{"t":"2026-05-01T12:00:00+00:00"}'
    assert decode_row(naive, schema) == {"t": dt.datetime(2026, 5, 1, 12, 0, tzinfo=UTC)}


def test_encoding_is_compact_and_keeps_column_order() -> None:
    text = encode_row({"b": 1, "a": "é", "c": None, "d": Decimal("1.50"), "e": b"\x00"})
    assert text == '{"b":1,"a":"é","c":null,"d":"1.50","e":"AA=="}'
    assert encode_row(None) is None


def test_missing_column_decodes_as_null_but_unknown_column_is_an_error() -> None:
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("added_later", pa.string())])
    assert decode_row('{"id":1}', schema) == {"id": 1, "added_later": None}
    with pytest.raises(ValueError, match=r"columns \['gone'\] that the table schema lacks"):
        decode_row('{"id":1,"gone":2}', schema)


@pytest.mark.parametrize(
    ("atype", "raw"),
    [(pa.int64(), "1.5"), (pa.int64(), "true"), (pa.bool_(), "1"), (pa.decimal128(5, 2), "1.5"),
     (pa.binary(), '"not base64!"'), (pa.date32(), '"2026-13-01"'), (pa.string(), "5")],
)  # fmt: skip
def test_wrongly_typed_text_fails_with_the_column_name(atype: pa.DataType, raw: str) -> None:
    schema = pa.schema([pa.field("col", atype)])
    with pytest.raises(ValueError, match="column 'col'"):
        decode_row('{"col":' + raw + "}", schema)


def test_unencodable_value_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot encode a object"):
        encode_row({"x": object()})
