"""Pure even-split math: distribution factor, bucket width, bucket packing, splits from boundaries."""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter
from decimal import Decimal

import pytest

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator, check_table_splits
from airflow_provider_mysqlcdc.core.chunking import (
    DEFAULT_MAX_DISTRIBUTION_FACTOR,
    DEFAULT_MIN_DISTRIBUTION_FACTOR,
    Segment,
    bucket_width,
    distribution_factor,
    even_split_applies,
    pack_buckets,
    splits_from_boundaries,
)
from airflow_provider_mysqlcdc.core.keys import KeyColumn, KeyOrder

U64_MAX = 2**64 - 1


# ------------------------------------------------------------------ distribution factor
def test_distribution_factor_dense_sparse_empty() -> None:
    assert distribution_factor(1, 1000, 1000) == 1.0
    assert distribution_factor(1, 10_000, 100) == 100.0
    assert distribution_factor(5, 5, 1) == 1.0
    assert distribution_factor(1, 10, 0) == math.inf
    assert distribution_factor(Decimal("0.5"), Decimal("99.5"), 100) == 1.0


def test_distribution_factor_is_exact_near_2_pow_64() -> None:
    # As floats both ends round to 2**64 and the factor would come out as 1/3.
    assert float(U64_MAX) == float(U64_MAX - 2)
    assert distribution_factor(U64_MAX - 2, U64_MAX, 3) == 1.0
    assert distribution_factor(U64_MAX - 999, U64_MAX, 1000) == 1.0
    assert distribution_factor(0, U64_MAX, 1) == float(2**64)


def test_even_split_applies_bounds_inclusive() -> None:
    assert even_split_applies(1.0)
    assert even_split_applies(DEFAULT_MIN_DISTRIBUTION_FACTOR)
    assert even_split_applies(DEFAULT_MAX_DISTRIBUTION_FACTOR)
    assert not even_split_applies(0.049)
    assert not even_split_applies(1000.5)
    assert not even_split_applies(math.inf)
    assert even_split_applies(5.0, lower=5.0, upper=5.0)


# ------------------------------------------------------------------ bucket width
def test_bucket_width_integer_keys() -> None:
    assert bucket_width(1.0, 8096) == 8096
    assert isinstance(bucket_width(1.0, 8096), int)
    assert bucket_width(2.5, 7) == 18  # 17.5 rounded up
    assert bucket_width(0.05, 7) == 1  # 0.35 -> at least one key unit
    assert bucket_width(1e-9, 1) == 1
    assert bucket_width(1000.0, 8096) == 8_096_000


def test_bucket_width_huge_factor_near_2_pow_64_is_a_python_int() -> None:
    # A factor of ~2^64 (two rows at 0 and 2^64-1): the width must stay an exact integer of at
    # least the factor's magnitude, with no float overflow or wrap-around.
    w = bucket_width(distribution_factor(0, U64_MAX, 1), 1)
    assert isinstance(w, int)
    assert 2**64 <= w < 2**64 + 2**20
    w3 = bucket_width(distribution_factor(0, U64_MAX, 1), 3)
    assert isinstance(w3, int)
    assert 3 * 2**64 <= w3 < 3 * 2**64 + 2**22
    assert U64_MAX // w == 0  # one bucket holds the whole key range


def test_bucket_width_decimal_keys_respects_scale() -> None:
    w = bucket_width(0.33333, 7, scale=4)
    assert w == Decimal("2.3334")  # 2.33331 rounded *up* to 4 places
    assert isinstance(w, Decimal)
    assert w.as_tuple().exponent == -4
    assert bucket_width(1e-9, 1, scale=4) == Decimal("0.0001")  # at least one unit of the scale
    assert bucket_width(1.0, 10, scale=2) == Decimal("10.00")
    assert bucket_width(0.1, 3, scale=1) == Decimal("0.3")  # repr-based: no 0.30000000000000004 -> 0.4


def test_bucket_width_rejects_bad_chunk_size() -> None:
    with pytest.raises(ValueError):
        bucket_width(1.0, 0)


# ------------------------------------------------------------------ pack_buckets
def _assign(buckets: list[tuple[int, int, int]], segments: list[Segment]) -> list[list[tuple[int, int, int]]]:
    """The buckets each segment covers (segments start at their first bucket's lo)."""
    starts = [s.lo for s in segments]
    out: list[list[tuple[int, int, int]]] = [[] for _ in segments]
    for b in buckets:
        if b[2] > 0:
            out[bisect.bisect_right(starts, b[0]) - 1].append(b)
    return out


def _check_packing(buckets: list[tuple[int, int, int]], chunk: int) -> list[Segment]:
    segs = pack_buckets(buckets, chunk)
    nonempty = [b for b in buckets if b[2] > 0]
    if not nonempty:
        assert segs == []
        return segs
    assert sum(s.rows for s in segs) == sum(b[2] for b in nonempty)
    assert segs[0].lo == nonempty[0][0]
    assert [s.lo for s in segs] == sorted({s.lo for s in segs})  # strictly increasing, in order
    for seg, members in zip(segs, _assign(nonempty, segs), strict=True):
        assert members, seg
        assert seg.lo == members[0][0]
        assert seg.rows == sum(b[2] for b in members)
        if len(members) > 1:
            assert seg.rows <= chunk, (seg, members)
            assert not seg.oversize
        else:
            assert seg.oversize == (seg.rows > 2 * chunk)
            if seg.oversize:
                assert seg.hi == members[0][1]
    return segs


def test_pack_small_buckets_never_exceed_chunk_size() -> None:
    buckets = [(i * 10, i * 10 + 10, 3) for i in range(10)]  # 30 rows
    segs = _check_packing(buckets, 7)
    assert [s.rows for s in segs] == [6, 6, 6, 6, 6]
    assert [s.lo for s in segs] == [0, 20, 40, 60, 80]
    assert segs[-1].hi == 100


def test_pack_exactly_chunk_size_fits() -> None:
    segs = _check_packing([(0, 1, 4), (1, 2, 3), (2, 3, 7)], 7)
    assert [(s.lo, s.rows) for s in segs] == [(0, 7), (2, 7)]


def test_pack_single_bucket_up_to_twice_chunk_kept_whole() -> None:
    segs = _check_packing([(0, 10, 2), (10, 20, 14), (20, 30, 1)], 7)
    assert [(s.lo, s.rows, s.oversize) for s in segs] == [(0, 2, False), (10, 14, False), (20, 1, False)]


def test_pack_oversize_bucket_flagged_and_isolated() -> None:
    segs = _check_packing([(0, 10, 2), (10, 20, 15), (20, 30, 1), (30, 40, 1)], 7)
    assert [(s.lo, s.hi, s.rows, s.oversize) for s in segs] == [
        (0, 10, 2, False),
        (10, 20, 15, True),
        (20, 40, 2, False),
    ]


def test_pack_skips_empty_buckets_and_handles_none() -> None:
    assert pack_buckets([], 5) == []
    assert pack_buckets([(0, 1, 0), (1, 2, 0)], 5) == []
    segs = _check_packing([(0, 1, 0), (1, 2, 3), (2, 3, 0), (3, 4, 3)], 5)
    assert [(s.lo, s.rows) for s in segs] == [(1, 3), (3, 3)]
    with pytest.raises(ValueError):
        pack_buckets([(0, 1, 1)], 0)


def test_pack_buckets_random_histograms() -> None:
    rng = random.Random(20260101)
    for _ in range(300):
        chunk = rng.randint(1, 50)
        lo = rng.choice([0, -(10**6), U64_MAX - 10**6])
        width = rng.randint(1, 1000)
        n = rng.randint(0, 60)
        buckets = []
        for i in range(n):
            rows = rng.choice([0, 1, rng.randint(1, chunk), rng.randint(chunk, 2 * chunk), rng.randint(1, 5 * chunk)])
            buckets.append((lo + i * width, lo + (i + 1) * width, rows))
        _check_packing(buckets, chunk)


# ------------------------------------------------------------------ splits_from_boundaries
def test_splits_from_boundaries_tile_the_key_space() -> None:
    cols = [KeyColumn("id", keys.INT)]
    splits = splits_from_boundaries("db.t", cols, [(10,), (20,)])
    assert [(s.split_id, s.start, s.end) for s in splits] == [(0, None, (10,)), (1, (10,), (20,)), (2, (20,), None)]
    assert all(s.table == "db.t" and s.key_columns == tuple(cols) for s in splits)
    check_table_splits(splits, KeyOrder(cols))


def test_splits_from_no_boundaries_is_one_unbounded_split() -> None:
    splits = splits_from_boundaries("db.t", [KeyColumn("id", keys.INT)], [])
    assert len(splits) == 1
    assert splits[0].start is None and splits[0].end is None


# ------------------------------------------------------------------ the even path, end to end in Python
def _even_boundaries(key_values: list[int], chunk: int) -> list[int]:
    """What the splitter's even path computes, with the histogram counted (and oversize buckets
    re-split every ``chunk`` keys, as the uneven path does) in Python."""
    lo, hi = min(key_values), max(key_values)
    width = bucket_width(distribution_factor(lo, hi, len(key_values)), chunk)
    hist = Counter((k - lo) // width for k in key_values)
    buckets = [(lo + b * width, lo + (b + 1) * width, n) for b, n in sorted(hist.items())]
    out = []
    for i, seg in enumerate(pack_buckets(buckets, chunk)):
        if i > 0:
            out.append(seg.lo)
        if seg.oversize:
            inside = sorted(k for k in key_values if seg.lo <= k and (seg.hi is None or k < seg.hi))
            out.extend(inside[chunk::chunk])
    return out


@pytest.mark.parametrize(
    "key_values",
    [
        list(range(1, 1001)),
        list(range(U64_MAX - 999, U64_MAX + 1)),
        [*range(1, 301), *range(10**12, 10**12 + 300)],
        [*range(0, 3000, 3)],
    ],
    ids=["dense", "near-2^64", "clustered", "stride-3"],
)
def test_even_path_boundaries_hold_every_key_once_and_stay_in_range(key_values: list[int]) -> None:
    chunk = 37
    bounds = _even_boundaries(key_values, chunk)
    assert bounds == sorted(set(bounds))
    assert all(min(key_values) < b <= max(key_values) for b in bounds)  # valid column values
    splits = splits_from_boundaries("db.t", [KeyColumn("id", keys.INT)], [(b,) for b in bounds])
    loc = ChunkLocator(splits)
    per_split = Counter(loc.index_of((k,)) for k in key_values)
    assert sum(per_split.values()) == len(key_values)
    assert max(per_split.values()) <= 2 * chunk


def test_unique_int_width_keeps_the_bound_without_counting() -> None:
    from airflow_provider_mysqlcdc.core.chunking import arithmetic_boundaries, unique_int_width

    assert unique_int_width(1.0, 100) == 100
    assert unique_int_width(1.5, 100) == 150
    assert unique_int_width(2.0, 100) == 200
    assert unique_int_width(0.3, 100) == 100  # a bad estimate cannot make chunks tiny
    assert unique_int_width(2.01, 100) is None  # sparser: the histogram decides
    # any window of w consecutive integers holds at most w unique keys <= 2 * chunk size
    for factor in (0.05, 0.9, 1.0, 1.7, 2.0):
        w = unique_int_width(factor, 37)
        assert w is not None and 37 <= w <= 74
    top = 2**64 - 1
    b = arithmetic_boundaries(top - 1000, top, 300)
    assert b == [top - 700, top - 400, top - 100] and all(x <= top for x in b)
    assert arithmetic_boundaries(5, 5, 10) == []
