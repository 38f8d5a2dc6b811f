"""Chunk-key values: JSON form, PAD SPACE semantics, collation orders, composite key order."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal

import pytest

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.keys import (
    BINARY,
    Collation,
    KeyColumn,
    KeyOrder,
    PadSpaceKey,
    decode_key_value,
    encode_key_value,
)

CODEPOINT_PAD = Collation(name="utf8mb4_bin", method="codepoint", pad_space=True)
CODEPOINT_NOPAD = Collation(name="utf8mb4_0900_bin", method="codepoint", pad_space=False)
LATIN1_BIN = Collation(name="latin1_bin", method="bytes", pad_space=True, codec="cp1252", charset="latin1")


def _ci_collation() -> Collation:
    """A tiny case-insensitive weight table in the shape fetch_collation builds (2-byte units)."""
    weights: dict[int, tuple[int, ...]] = {0x09: (0x09,), 0x20: (0x20,)}
    for c in range(ord("a"), ord("z") + 1):
        weights[c] = (c - 0x20,)
        weights[c - 0x20] = (c - 0x20,)
    weights[ord("é")] = (ord("E"),)  # accent-insensitive, like general_ci
    weights[ord("ß")] = (ord("S"), ord("S"))  # expands to two units
    return Collation(
        name="test_ci", method="weights", pad_space=True, weights=weights, supplementary=(0xFFFD,)
    )


CI = _ci_collation()


# ------------------------------------------------------------------ PadSpaceKey
def _pk(s: str) -> PadSpaceKey:
    return PadSpaceKey([ord(c) for c in s], 0x20)


def test_pad_space_trailing_spaces_are_equal() -> None:
    assert _pk("a") == _pk("a ")
    assert _pk("a") == _pk("a   ")
    assert hash(_pk("a")) == hash(_pk("a  "))
    assert _pk("") == _pk("   ")


def test_pad_space_is_not_strip_tab_sorts_before_padding() -> None:
    # 'a\t' vs 'a' compares 'a\t' with 'a ' : '\t' (9) < ' ' (32)
    assert _pk("a\t") < _pk("a")
    assert _pk("a") > _pk("a\t")
    assert not _pk("a") < _pk("a\t")
    # stripping every whitespace would have made them equal
    assert _pk("a\t") != _pk("a")


def test_pad_space_prefix_followed_by_a_character_above_space_sorts_after() -> None:
    assert _pk("a") < _pk("ab")
    assert _pk("ab") > _pk("a")
    assert _pk("a") < _pk("a !")  # '!' (33) > ' ' after skipping the inner space
    assert _pk("a !") > _pk("a ")


def test_pad_space_inner_space_then_control_char() -> None:
    # 'a \x01' vs 'a': the first non-space of the remainder decides, \x01 < ' '
    assert _pk("a \x01") < _pk("a")
    assert _pk("a") > _pk("a \x01")


def test_pad_space_common_prefix_differs() -> None:
    assert _pk("abc") < _pk("abd")
    assert _pk("abd ") > _pk("abc")
    assert _pk("b") > _pk("abc")


def test_pad_space_equal_is_not_less() -> None:
    assert not _pk("x ") < _pk("x")
    assert not _pk("x") < _pk("x ")
    assert _pk("x ") <= _pk("x")


def test_pad_space_sorting_matches_padded_comparison() -> None:
    values = ["a", "a ", "a\t", "a\x00", "ab", "a b", "a  b", "", " ", "\t", "b", "a !", "a\x1f"]
    width = max(map(len, values)) + 1
    by_padding = sorted(values, key=lambda s: [ord(c) for c in s.ljust(width)])
    by_key = sorted(values, key=_pk)
    assert [s.ljust(width) for s in by_key] == [s.ljust(width) for s in by_padding]


def test_pad_space_compare_other_type_not_implemented() -> None:
    assert _pk("a") != "a"
    with pytest.raises(TypeError):
        _ = _pk("a") < "b"  # type: ignore[operator]


# ------------------------------------------------------------------ Collation
def test_codepoint_order_is_case_sensitive_uppercase_first() -> None:
    k = CODEPOINT_PAD.sort_key
    assert k("B") < k("a")
    assert k("Z") < k("a")
    assert k("a") != k("A")
    assert k("é") > k("z")  # U+00E9 > U+007A


def test_codepoint_order_differs_from_utf16_for_supplementary_chars() -> None:
    # U+FF5E (BMP, high) vs U+1F600 (supplementary): code point order puts the emoji after;
    # UTF-16 code unit order would put the surrogate 0xD83D before 0xFF5E.
    k = CODEPOINT_PAD.sort_key
    assert k("\uff5e") < k("\U0001f600")


def test_codepoint_pad_and_no_pad() -> None:
    assert CODEPOINT_PAD.sort_key("a") == CODEPOINT_PAD.sort_key("a ")
    assert CODEPOINT_NOPAD.sort_key("a") != CODEPOINT_NOPAD.sort_key("a ")
    assert CODEPOINT_NOPAD.sort_key("a") < CODEPOINT_NOPAD.sort_key("a ")
    # NO PAD: 'a\t' > 'a' (longer, shared prefix); PAD SPACE: 'a\t' < 'a'
    assert CODEPOINT_NOPAD.sort_key("a\t") > CODEPOINT_NOPAD.sort_key("a")
    assert CODEPOINT_PAD.sort_key("a\t") < CODEPOINT_PAD.sort_key("a")


def test_codepoint_accepts_bytes_values() -> None:
    assert CODEPOINT_PAD.sort_key("é".encode()) == CODEPOINT_PAD.sort_key("é")


def test_bytes_method_orders_by_encoded_byte() -> None:
    k = LATIN1_BIN.sort_key
    # cp1252: '€' is 0x80, 'é' is 0xE9, so '€' < 'é' although U+20AC > U+00E9
    assert k("€") < k("é")
    assert CODEPOINT_PAD.sort_key("€") > CODEPOINT_PAD.sort_key("é")
    assert k("a") == k("a  ")


def test_binary_order_has_no_padding() -> None:
    k = BINARY.sort_key
    assert k(b"a") < k(b"a ")
    assert k(b"a") != k(b"a ")
    assert k(b"a\x00") > k(b"a")
    assert k("a") == k(b"a")
    assert k(b"\xff") > k(b"\x7f")


def test_weights_case_and_accent_insensitive() -> None:
    k = CI.sort_key
    assert k("abc") == k("ABC") == k("aBc ")
    assert k("é") == k("e") == k("E")
    assert k("a") < k("B") < k("c")  # case-insensitive: a < B (codepoint would say B < a)
    assert CODEPOINT_PAD.sort_key("B") < CODEPOINT_PAD.sort_key("a")
    assert k("ß") == k("ss")
    assert k("a\t") < k("a")


def test_weights_supplementary_and_unknown_characters() -> None:
    assert CI.units("\U0001f600") == (0xFFFD,)
    assert CI.sort_key("\U0001f600") == CI.sort_key("\U00010000")
    with pytest.raises(ValueError, match="U\\+0031"):
        CI.sort_key("1")  # not in the table


def test_unknown_method_has_no_units() -> None:
    with pytest.raises(ValueError, match="no weight units"):
        Collation(name="x", method="nonsense").sort_key("a")


@pytest.mark.parametrize("coll", [CI, CODEPOINT_PAD, CODEPOINT_NOPAD, LATIN1_BIN, BINARY])
def test_collation_dict_round_trip_through_json(coll: Collation) -> None:
    back = Collation.from_dict(json.loads(json.dumps(coll.to_dict())))
    assert back == coll
    for a, b in [("aB", "Ab "), ("a\t", "a"), ("ss", "ß"), ("e", "é")]:
        if coll.method == "binary":
            a, b = a.encode(), b.encode()  # type: ignore[assignment]
        try:
            expect = coll.sort_key(a) < coll.sort_key(b), coll.sort_key(a) == coll.sort_key(b)
        except ValueError:
            continue
        assert (back.sort_key(a) < back.sort_key(b), back.sort_key(a) == back.sort_key(b)) == expect


# ------------------------------------------------------------------ encode/decode
@pytest.mark.parametrize(
    ("kind", "value", "encoded"),
    [
        (keys.INT, 2**64 - 1, 2**64 - 1),
        (keys.INT, -5, -5),
        (keys.DECIMAL, Decimal("12345678901234567.8901"), "12345678901234567.8901"),
        (keys.DECIMAL, Decimal("-0.0001"), "-0.0001"),
        (keys.FLOAT, 1.5, 1.5),
        (keys.STRING, "Ärger ", "Ärger "),
        (keys.BYTES, b"\x00\xffab", "AP9hYg=="),
        (keys.DATE, dt.date(2026, 2, 28), "2026-02-28"),
        (keys.DATETIME, dt.datetime(2026, 2, 28, 23, 59, 59, 123456), "2026-02-28T23:59:59.123456"),
    ],
)
def test_encode_decode_round_trip(kind: str, value: object, encoded: object) -> None:
    enc = encode_key_value(kind, value)
    assert enc == encoded
    assert json.loads(json.dumps(enc)) == enc
    dec = decode_key_value(kind, json.loads(json.dumps(enc)))
    assert dec == value
    assert type(dec) is type(value)


def test_decimal_is_encoded_as_string_not_float() -> None:
    v = Decimal("9999999999999999.9999")
    enc = encode_key_value(keys.DECIMAL, v)
    assert isinstance(enc, str)
    assert decode_key_value(keys.DECIMAL, enc) == v
    assert Decimal(float(v)) != v  # a float would have lost digits


def test_none_and_unknown_kind() -> None:
    assert encode_key_value(keys.INT, None) is None
    assert decode_key_value(keys.STRING, None) is None
    with pytest.raises(ValueError, match="unknown key kind"):
        encode_key_value("uuid", "x")
    with pytest.raises(ValueError, match="unknown key kind"):
        decode_key_value("uuid", "x")


# ------------------------------------------------------------------ KeyOrder
def test_key_order_composite_is_lexicographic_with_collation() -> None:
    cols = [KeyColumn("name", keys.STRING, "test_ci"), KeyColumn("id", keys.INT)]
    order = KeyOrder(cols, {"test_ci": CI})
    k = order.sort_key
    assert k(("abc", 5)) == k(("ABC ", 5))
    assert k(("abc", 5)) < k(("ABC", 6))
    assert k(("abc", 99)) < k(("abd", 1))  # first column decides before the second
    assert k(("a", 2**64 - 1)) < k(("B", 0))


def test_key_order_errors() -> None:
    with pytest.raises(ValueError, match="needs a collation"):
        KeyOrder([KeyColumn("s", keys.STRING)])
    with pytest.raises(ValueError, match="no ordering known"):
        KeyOrder([KeyColumn("s", keys.STRING, "utf8mb4_general_ci")], {})
    with pytest.raises(ValueError, match="unsupported key kind"):
        KeyOrder([KeyColumn("s", "uuid")])
    order = KeyOrder([KeyColumn("a", keys.INT), KeyColumn("b", keys.INT)])
    with pytest.raises(ValueError, match="expected 2"):
        order.sort_key((1,))


def test_key_order_bytes_and_datetime() -> None:
    order = KeyOrder([KeyColumn("b", keys.BYTES), KeyColumn("t", keys.DATETIME)])
    naive = dt.datetime(2026, 1, 1, 12, 0)
    aware = dt.datetime(2026, 1, 1, 13, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert order.sort_key((b"a", naive)) == order.sort_key((b"a", aware))
    assert order.sort_key((b"a", naive)) < order.sort_key((b"a ", naive))


def test_key_column_dict_round_trip() -> None:
    c = KeyColumn("name", keys.STRING, "utf8mb4_general_ci")
    assert KeyColumn.from_dict(c.to_dict()) == c
    assert KeyColumn.from_dict({"name": "id", "kind": "int"}) == KeyColumn("id", keys.INT, None)


# ------------------------------------------------------------------ collations the server orders
class _Weights:
    """A stand-in for the server's WEIGHT_STRING: 2-byte units, case-insensitive, 'ch' one unit
    after 'c' (a contraction), records each round it is asked."""

    def __init__(self) -> None:
        self.rounds: list[list[str]] = []

    def weigh(self, collation: Collation, values: list[str]) -> list[bytes]:
        self.rounds.append(list(values))
        out = []
        for v in values:
            units, i, low = [], 0, v.lower()
            while i < len(low):
                if low.startswith("ch", i):
                    units.append(ord("c") * 2 + 1)
                    i += 2
                    continue
                units.append(ord(low[i]) * 2)
                i += 1
            out.append(b"".join(u.to_bytes(2, "big") for u in units))
        return out


@pytest.fixture
def weights() -> Iterator[_Weights]:
    source = _Weights()
    before = keys.weight_source()
    keys.set_weight_source(source)
    yield source
    keys.set_weight_source(before)


def test_a_server_collation_orders_by_the_servers_weight_strings_and_asks_each_value_once(weights: _Weights) -> None:
    coll = Collation(name="x_0900_ai_ci", method="server", pad_space=False)
    order = KeyOrder([KeyColumn("k", keys.STRING, "x_0900_ai_ci")], {"x_0900_ai_ci": coll})
    values = ["d", "Ch", "cz", "c", "ca", "CH"]
    order.prefetch([[v] for v in values])
    assert weights.rounds == [values]  # one round for the batch
    ranked = sorted(values, key=lambda v: order.sort_key([v]))
    assert ranked == ["c", "ca", "cz", "Ch", "CH", "d"]  # the contraction sorts after every c-word
    assert order.sort_key(["ch"]) == order.sort_key(["CH"])
    assert len(weights.rounds) == 2 and weights.rounds[1] == ["ch"]  # a value not prefetched: asked once
    order.sort_key(["ch"])
    assert len(weights.rounds) == 2


def test_a_padding_server_collation_compares_as_if_padded_with_spaces(weights: _Weights) -> None:
    coll = Collation(name="x_uca1400_ai_ci", method="server", pad_space=True, space_weight=ord(" ") * 2)
    assert coll.sort_key("ab") == coll.sort_key("AB  ")
    assert coll.sort_key("ab\t") < coll.sort_key("ab")  # the tab weighs below the padding space


def test_a_server_collation_without_a_source_names_what_is_missing() -> None:
    before = keys.weight_source()
    keys.set_weight_source(None)
    try:
        with pytest.raises(RuntimeError, match="ordered by the server"):
            Collation(name="x_0900_ai_ci", method="server", pad_space=False).sort_key("a")
    finally:
        keys.set_weight_source(before)


def test_a_server_collation_travels_without_its_cache(weights: _Weights) -> None:
    import pickle

    coll = Collation(name="x_0900_ai_ci", method="server", pad_space=False)
    coll.sort_key("a")
    copy = pickle.loads(pickle.dumps(coll))
    assert copy == coll and copy._cache == {} and Collation.from_dict(json.loads(json.dumps(coll.to_dict()))) == coll
    copy.sort_key("a")
    assert len(weights.rounds) == 2  # asked again in the new process


def test_time_keys_order_by_signed_length_whatever_their_form() -> None:
    order = keys.KeyOrder([keys.KeyColumn("k", keys.TIME)])
    texts = ["-838:59:59", "-12:34:56.789", "-00:00:01.5", "-00:00:00.000001", "00:00:00", "00:00:00.001",
             "23:59:59.999999", "100:00:00.25"]  # fmt: skip
    assert sorted(reversed(texts), key=lambda t: order.sort_key([t])) == texts
    assert order.sort_key(["-00:00:01.5"]) == order.sort_key([-dt.timedelta(seconds=1, microseconds=500_000)])
    assert keys.time_text("-1:02:03.4") == "-01:02:03.400000"
    assert keys.decode_key_value(keys.TIME, keys.encode_key_value(keys.TIME, "100:00:00")) == "100:00:00.000000"


def test_bit_keys_order_as_unsigned_numbers_booleans_included() -> None:
    order = keys.KeyOrder([keys.KeyColumn("k", keys.BIT)])
    assert order.sort_key([False]) < order.sort_key([True]) < order.sort_key([2]) < order.sort_key([Decimal(2**64 - 1)])
    assert keys.encode_key_value(keys.BIT, True) == 1
