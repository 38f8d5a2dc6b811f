"""BinlogOffset: ordering across file rotation, serialization, parse errors (docs/architecture.md, "Binlog offsets")."""

from __future__ import annotations

import json

import pytest

from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_file_number, min_offset


def test_file_number_is_the_numeric_suffix() -> None:
    assert binlog_file_number("mysql-bin.000042") == 42
    assert binlog_file_number("mysql-bin.1000000") == 1_000_000
    assert binlog_file_number("/var/lib/mysql/host-bin.000007") == 7


@pytest.mark.parametrize("name", ["mysql-bin", "mysql-bin.", "mysql-bin.00a", "", "mysql-bin.000001.index"])
def test_file_number_rejects_non_binlog_names(name: str) -> None:
    with pytest.raises(ValueError, match="not a binlog file name"):
        binlog_file_number(name)


def test_rotation_orders_by_file_number_before_position() -> None:
    a = BinlogOffset("mysql-bin.000009", 999_999)
    b = BinlogOffset("mysql-bin.000010", 4)
    assert a < b
    assert b > a
    assert not b < a
    assert max(a, b) is b


def test_suffix_widening_compares_numerically_not_as_strings() -> None:
    # As strings "mysql-bin.1000000" < "mysql-bin.999999"; numerically it is the later file.
    older = BinlogOffset("mysql-bin.999999", 500)
    newer = BinlogOffset("mysql-bin.1000000", 4)
    assert older.file > newer.file  # the string order would be wrong
    assert older < newer
    assert sorted([newer, older]) == [older, newer]


def test_same_file_orders_by_position() -> None:
    assert BinlogOffset("mysql-bin.000003", 4) < BinlogOffset("mysql-bin.000003", 5)
    assert BinlogOffset("mysql-bin.000003", 5) <= BinlogOffset("mysql-bin.000003", 5)
    assert BinlogOffset("mysql-bin.000003", 6) >= BinlogOffset("mysql-bin.000003", 5)


def test_equality_and_hash_ignore_gtid_set() -> None:
    a = BinlogOffset("mysql-bin.000003", 120, "0-1-5")
    b = BinlogOffset("mysql-bin.000003", 120, None)
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != BinlogOffset("mysql-bin.000003", 121)
    assert a != BinlogOffset("mysql-bin.000004", 120)


def test_comparison_with_other_types_is_not_supported() -> None:
    off = BinlogOffset("mysql-bin.000001", 4)
    assert off != ("mysql-bin.000001", 4)
    with pytest.raises(TypeError):
        _ = off < ("mysql-bin.000001", 5)  # type: ignore[operator]


def test_min_offset_across_rotation() -> None:
    offs = [
        BinlogOffset("mysql-bin.000010", 4),
        BinlogOffset("mysql-bin.000009", 77_000),
        BinlogOffset("mysql-bin.000011", 1),
    ]
    assert min_offset(offs) == BinlogOffset("mysql-bin.000009", 77_000)
    with pytest.raises(ValueError):
        min_offset([])


def test_negative_position_is_rejected() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        BinlogOffset("mysql-bin.000001", -1)


def test_bad_file_name_is_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="not a binlog file name"):
        BinlogOffset("mysql-bin", 4)


@pytest.mark.parametrize(
    "off",
    [
        BinlogOffset("mysql-bin.000010", 4),
        BinlogOffset("mysql-bin.000009", 2**40, "0-1-42,1-2-7"),
    ],
)
def test_json_round_trip_keeps_file_pos_and_gtid(off: BinlogOffset) -> None:
    text = off.to_json()
    json.loads(text)  # valid JSON
    back = BinlogOffset.from_json(text)
    assert back == off
    assert (back.file, back.pos, back.gtid_set) == (off.file, off.pos, off.gtid_set)


def test_to_dict_omits_empty_gtid_and_from_dict_needs_file_and_pos() -> None:
    assert BinlogOffset("mysql-bin.000001", 4).to_dict() == {"file": "mysql-bin.000001", "pos": 4}
    assert BinlogOffset.from_dict({"file": "mysql-bin.000001", "pos": "4", "gtid_set": ""}).gtid_set is None
    with pytest.raises(ValueError, match="'file' and 'pos'"):
        BinlogOffset.from_dict({"file": "mysql-bin.000001"})
    with pytest.raises(ValueError, match="'file' and 'pos'"):
        BinlogOffset.from_json('{"pos": 4}')


def test_parse_and_str_round_trip() -> None:
    off = BinlogOffset.parse("mysql-bin.000010:1234")
    assert off == BinlogOffset("mysql-bin.000010", 1234)
    assert BinlogOffset.parse(str(off)) == off
    # rpartition: a path with a colon in it still parses
    assert BinlogOffset.parse("c:/logs/mysql-bin.000002:4").file == "c:/logs/mysql-bin.000002"


@pytest.mark.parametrize(
    "text", ["mysql-bin.000010", "mysql-bin.000010:", "mysql-bin.000010:-4", ":4", "x:4", "a.1:4b"]
)
def test_parse_errors(text: str) -> None:
    with pytest.raises(ValueError):
        BinlogOffset.parse(text)
