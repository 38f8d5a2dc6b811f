"""SnapshotChunk containment, ChunkLocator's binary search, check_table_splits and group_splits."""

from __future__ import annotations

import itertools
import json
import random
from decimal import Decimal

import pytest

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.chunk import (
    DEFAULT_MAX_MAP_LENGTH,
    ChunkGroup,
    ChunkLocator,
    SnapshotChunk,
    check_table_splits,
    group_splits,
)
from airflow_provider_mysqlcdc.core.chunking import splits_from_boundaries
from airflow_provider_mysqlcdc.core.keys import Collation, KeyColumn, KeyOrder

ID = (KeyColumn("id", keys.INT),)


def _ci() -> Collation:
    weights: dict[int, tuple[int, ...]] = {0x20: (0x20,), 0x09: (0x09,)}
    for c in range(ord("a"), ord("z") + 1):
        weights[c] = weights[c - 0x20] = (c - 0x20,)
    return Collation(name="test_ci", method="weights", weights=weights)


CI = _ci()


def _int_splits(bounds: list[int], table: str = "db.t") -> list[SnapshotChunk]:
    return splits_from_boundaries(table, ID, [(b,) for b in bounds])


# ------------------------------------------------------------------ ChunkLocator
def test_locate_keys_on_and_around_boundaries() -> None:
    splits = _int_splits([10, 20, 30])
    loc = ChunkLocator(splits)
    cases = {
        -(2**63): 0, 9: 0,  # -inf end
        10: 1, 11: 1, 19: 1,  # a key exactly on a boundary belongs to the split it starts
        20: 2, 29: 2,
        30: 3, 31: 3, 2**64 - 1: 3, 10**30: 3,  # +inf end
    }
    for key, idx in cases.items():
        assert loc.index_of((key,)) == idx, key
        assert loc.locate((key,)).split_id == idx
        # contains agrees with locate, and no other split claims the key
        assert [s.split_id for s in splits if s.contains((key,), loc.order)] == [idx]


def test_single_split_holds_everything() -> None:
    loc = ChunkLocator(_int_splits([]))
    assert len(loc.splits) == 1
    for k in (-(10**20), 0, 10**20):
        assert loc.locate((k,)).split_id == 0


def test_locator_sorts_splits_by_id() -> None:
    splits = _int_splits([5, 15])
    loc = ChunkLocator(list(reversed(splits)))
    assert [s.split_id for s in loc.splits] == [0, 1, 2]
    assert loc.locate((15,)).split_id == 2


def test_locate_agrees_with_linear_scan_on_random_keys() -> None:
    rng = random.Random(7)
    bounds = sorted(rng.sample(range(-(10**6), 10**6), 300))
    splits = _int_splits(bounds)
    loc = ChunkLocator(splits)
    probes = [rng.randint(-(10**6) - 5, 10**6 + 5) for _ in range(2000)] + bounds + [b - 1 for b in bounds]
    for k in probes:
        expected = [s.split_id for s in splits if s.contains((k,), loc.order)]
        assert len(expected) == 1
        assert loc.index_of((k,)) == expected[0]


def test_locate_composite_keys_row_value_order() -> None:
    cols = (KeyColumn("tenant", keys.STRING, "test_ci"), KeyColumn("id", keys.INT))
    splits = splits_from_boundaries("db.t", cols, [("acme", 100), ("acme", 200), ("beta", 0)])
    loc = ChunkLocator(splits, {"test_ci": CI})
    cases = [
        (("acme", 99), 0),
        (("ACME", 100), 1),  # equal under the collation: on the boundary
        (("acme ", 150), 1),  # trailing space pads away
        (("acme", 199), 1),
        (("Acme", 200), 2),
        (("acme", 10**9), 2),  # second column larger but first still 'acme'
        (("alpha", -5), 2),  # 'alpha' > 'acme' regardless of id
        (("BETA", -1), 2),
        (("beta", 0), 3),
        (("Zulu", -(10**9)), 3),
        (("", 10**9), 0),
        (("aaa", 10**9), 0),
    ]
    for key, idx in cases:
        assert loc.index_of(key) == idx, key
        assert [s.split_id for s in splits if s.contains(key, loc.order)] == [idx], key


def test_naive_per_column_comparison_would_misplace_composite_keys() -> None:
    # Row-value order: (2, 10) > (1, 50), so it lies in [(1, 50), +inf); the naive per-column test
    # "a >= 1 AND b >= 50" would reject it from that split.
    cols = (KeyColumn("a", keys.INT), KeyColumn("b", keys.INT))
    splits = splits_from_boundaries("db.t", cols, [(1, 50)])
    loc = ChunkLocator(splits)
    key = (2, 10)
    assert loc.locate(key).split_id == 1
    assert not splits[1].contains((1, 49), loc.order)
    assert splits[0].contains((1, 49), loc.order)


def test_locate_string_keys_with_collation() -> None:
    cols = (KeyColumn("s", keys.STRING, "test_ci"),)
    splits = splits_from_boundaries("db.t", cols, [("b",), ("m",)])
    loc = ChunkLocator(splits, {"test_ci": CI})
    assert loc.locate(("A",)).split_id == 0
    assert loc.locate(("B",)).split_id == 1  # equal to 'b' here; code point order would say 'B' < 'b'
    assert loc.locate(("b ",)).split_id == 1
    assert loc.locate(("a\t",)).split_id == 0
    assert loc.locate(("Lzz",)).split_id == 1
    assert loc.locate(("M",)).split_id == 2
    assert loc.locate(("zzz",)).split_id == 2


def test_locator_requires_collations_for_string_keys() -> None:
    cols = (KeyColumn("s", keys.STRING, "test_ci"),)
    with pytest.raises(ValueError, match="no ordering known"):
        ChunkLocator(splits_from_boundaries("db.t", cols, [("b",)]))
    with pytest.raises(ValueError, match="no splits"):
        ChunkLocator([])


# ------------------------------------------------------------------ check_table_splits
def test_check_table_splits_accepts_a_tiling() -> None:
    check_table_splits(_int_splits([1, 2, 3]), KeyOrder(ID))
    check_table_splits(_int_splits([]), KeyOrder(ID))


def test_check_table_splits_rejects_bounded_ends() -> None:
    s = _int_splits([10])
    bad_first = [SnapshotChunk("db.t", 0, ID, (0,), (10,)), s[1]]
    with pytest.raises(ValueError, match="-inf"):
        check_table_splits(bad_first, KeyOrder(ID))
    bad_last = [s[0], SnapshotChunk("db.t", 1, ID, (10,), (20,))]
    with pytest.raises(ValueError, match=r"\+inf"):
        check_table_splits(bad_last, KeyOrder(ID))
    with pytest.raises(ValueError, match="at least one"):
        check_table_splits([], KeyOrder(ID))


def test_check_table_splits_rejects_gaps_overlaps_and_empty_splits() -> None:
    gap = [
        SnapshotChunk("db.t", 0, ID, None, (10,)),
        SnapshotChunk("db.t", 1, ID, (11,), None),
    ]
    with pytest.raises(ValueError, match="not adjacent"):
        check_table_splits(gap, KeyOrder(ID))
    empty = _int_splits([10, 10])
    with pytest.raises(ValueError, match="empty or reversed"):
        check_table_splits(empty, KeyOrder(ID))
    reversed_ = _int_splits([20, 10])
    with pytest.raises(ValueError, match="empty or reversed"):
        check_table_splits(reversed_, KeyOrder(ID))
    with pytest.raises(ValueError):
        ChunkLocator(gap)


def test_check_table_splits_uses_collation_equality_for_adjacency() -> None:
    cols = (KeyColumn("s", keys.STRING, "test_ci"),)
    split_a = SnapshotChunk("db.t", 0, cols, None, ("abc",))
    split_b = SnapshotChunk("db.t", 1, cols, ("ABC ",), None)
    check_table_splits([split_a, split_b], KeyOrder(cols, {"test_ci": CI}))


# ------------------------------------------------------------------ serialization
def test_split_dict_round_trip_through_json() -> None:
    cols = (
        KeyColumn("d", keys.DECIMAL),
        KeyColumn("s", keys.STRING, "utf8mb4_general_ci"),
        KeyColumn("b", keys.BYTES),
    )
    split = SnapshotChunk("db.t", 3, cols, (Decimal("1.5000"), "x ", b"\x00"), None)
    d = json.loads(json.dumps(split.to_dict()))
    assert d["start"] == ["1.5000", "x ", "AA=="]
    assert d["end"] is None
    assert d["key_columns"] == ["d", "s", "b"]
    back = SnapshotChunk.from_dict(d)
    assert back == split
    assert back.id == "db.t#3"


def test_split_from_dict_defaults_to_int_keys() -> None:
    s = SnapshotChunk.from_dict({"table": "db.t", "split_id": "1", "key_columns": ["id"], "start": [5], "end": [9]})
    assert s == SnapshotChunk("db.t", 1, ID, (5,), (9,))


# ------------------------------------------------------------------ group_splits
def _many(n: int) -> list[SnapshotChunk]:
    return _int_splits(list(range(1, n)))  # n splits


def test_group_splits_in_order_of_chunks_per_group() -> None:
    splits = _many(10)
    groups = group_splits(splits, 3)
    assert [len(g.splits) for g in groups] == [3, 3, 3, 1]
    assert [g.group_id for g in groups] == [0, 1, 2, 3]
    assert [s for g in groups for s in g.splits] == splits


@pytest.mark.parametrize(("n", "per", "max_groups"), [(5000, 1, 1024), (5000, 4, 1024), (1025, 1, 1024), (7, 1, 3)])
def test_group_splits_caps_at_max_groups(n: int, per: int, max_groups: int) -> None:
    splits = _many(n)
    groups = group_splits(splits, per, max_groups)
    assert 1 <= len(groups) <= max_groups
    assert all(g.splits for g in groups)
    assert [s for g in groups for s in g.splits] == splits  # every split once, order kept
    assert [g.group_id for g in groups] == list(range(len(groups)))
    assert max(len(g.splits) for g in groups) >= per


def test_group_splits_not_capped_below_max() -> None:
    groups = group_splits(_many(1024), 1)
    assert len(groups) == 1024 == DEFAULT_MAX_MAP_LENGTH
    assert len(group_splits(_many(1025), 1)) <= DEFAULT_MAX_MAP_LENGTH


def test_group_splits_across_tables_and_labels() -> None:
    a = _int_splits([10, 20], "db.a")
    b = _int_splits([5], "db.b")
    groups = group_splits(a + b, 2)
    assert [g.tables for g in groups] == [["db.a"], ["db.a", "db.b"], ["db.b"]]
    assert groups[0].chunk_ranges() == "db.a chunks 0\u20131"
    assert groups[1].chunk_ranges() == "db.a chunk 2, db.b chunk 0"
    assert [g.label() for g in groups] == ["group 0: 1 table, 2 chunks", "group 1: 2 tables, 2 chunks",
                                           "group 2: 1 table, 1 chunk"]  # fmt: skip
    back = ChunkGroup.from_dict(json.loads(json.dumps(groups[1].to_dict())))
    assert back.splits == groups[1].splits and back.group_id == 1


def test_group_splits_edge_cases() -> None:
    assert group_splits([], 4) == []
    with pytest.raises(ValueError):
        group_splits(_many(3), 0)
    with pytest.raises(ValueError):
        group_splits(_many(3), 1, 0)


def test_fill_gaps_completes_a_repair_plans_chunks_to_tile_the_table() -> None:
    from airflow_provider_mysqlcdc.core.chunk import ChunkLocator, SnapshotChunk, fill_gaps
    from airflow_provider_mysqlcdc.core.keys import KeyColumn

    col = (KeyColumn("id", "int"),)
    bounds = [None, 10, 20, 30, 40, None]
    table = [SnapshotChunk("d.t", i, col, None if lo is None else (lo,), None if hi is None else (hi,))
             for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]  # fmt: skip
    assert fill_gaps(table) == table  # a whole table tiles already
    some = [table[1], table[3]]  # [10, 20) and [30, 40)
    filled = fill_gaps(some)
    assert [(s.split_id, s.start, s.end) for s in filled] == [
        (0, None, (10,)), (1, (10,), (20,)), (2, (20,), (30,)), (3, (30,), (40,)), (4, (40,), None),
    ]  # fmt: skip
    locator = ChunkLocator(filled)
    assert [locator.locate((k,)).split_id for k in (5, 15, 25, 35, 99)] == [0, 1, 2, 3, 4]
    assert list(locator.indexes_of([(5,), (15,), (35,), (99,)])) == [0, 1, 3, 4]
