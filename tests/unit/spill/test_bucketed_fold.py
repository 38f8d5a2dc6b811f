"""Folding bucket by bucket gives exactly what folding everything at once gives.

Random op sequences over a small key space (collisions, key moves between buckets, keys equal
under a case-insensitive collation but distinct as stored values) are folded in memory
(``fold_block``) and by :class:`BucketedFold` with several bucket counts, blocks added in any
order; the upserts and delete keys must be the same sets, and each key in exactly one bucket.
Also: the key hash is the same for equal keys of every key type and spreads keys evenly.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_mysqlcdc.core.change_block import BlockBuilder, block_schema, fold_block
from airflow_provider_mysqlcdc.core.key_buckets import key_buckets, key_hash
from airflow_provider_mysqlcdc.spill.bucketed_fold import BucketedFold, buckets_for

PK = ["a", "b"]
SCHEMA = pa.schema([
    pa.field("a", pa.int64(), nullable=False),
    pa.field("b", pa.string(), nullable=False),
    pa.field("v", pa.int64()),
])  # fmt: skip
KEYS = [(a, b) for a in range(6) for b in ("x", "X", "yy")]


def _row(key: tuple[Any, ...], v: int) -> dict[str, Any]:
    return {"a": key[0], "b": key[1], "v": v}


def _blocks(spec: list[tuple[str, Any, Any, int]], per_block: int) -> list[pa.RecordBatch]:
    schema = block_schema(SCHEMA, PK)
    b = BlockBuilder(schema)
    out = []
    for i, (op, k1, k2, v) in enumerate(spec):
        if op == "c":
            before, after = None, _row(k2, v)
        elif op == "u":
            before, after = _row(k1, v + 1), _row(k2, v)
        elif op == "u*":  # delete-half dropped by the handoff filter
            op, before, after = "u", None, _row(k2, v)
        else:
            before, after = _row(k1, v), None
        b.add(op, "mysql-bin.000001", 4 + i, 1, 100 + i, 0, i, 1_700_000_000, before, after)
        if len(b) >= per_block:
            out.append(b.build())
    if len(b):
        out.append(b.build())
    return out


def _as_sets(up: pa.Table, dels: pa.Table) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    ups = {tuple(r.values()) for r in up.select(["a", "b", "v"]).to_pylist()}
    ds = {tuple(r.values()) for r in dels.select(PK).to_pylist()}
    return ups, ds


change = st.tuples(st.sampled_from(["c", "u", "d", "u*"]), st.sampled_from(KEYS), st.sampled_from(KEYS),
                   st.integers(0, 99))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(spec=st.lists(change, max_size=60), per_block=st.integers(1, 9), buckets=st.integers(1, 7),
       reverse=st.booleans())  # fmt: skip
def test_bucketed_fold_equals_fold_block(spec: list[Any], per_block: int, buckets: int, reverse: bool,
                                         tmp_path_factory: pytest.TempPathFactory) -> None:  # fmt: skip
    blocks = _blocks(spec, per_block)
    if not blocks:
        return
    want = _as_sets(*fold_block(pa.Table.from_batches(blocks).sort_by("seq"), PK))
    fold = BucketedFold(PK, buckets, str(tmp_path_factory.mktemp("fold")))
    for blk in reversed(blocks) if reverse else blocks:
        fold.add(blk)
    ups: set[tuple[Any, ...]] = set()
    dels: set[tuple[Any, ...]] = set()
    seen_keys: list[tuple[Any, ...]] = []
    for fb in fold.buckets():
        u, d = _as_sets(fb.upserts, fb.delete_keys)
        ups |= u
        dels |= d
        seen_keys += [k[:2] for k in u] + list(d)
    fold.close()
    assert (ups, dels) == want
    assert len(seen_keys) == len(set(seen_keys))  # no key in two buckets, none twice
    assert fold.changes == len(spec)


def test_equal_keys_hash_equally_for_every_key_type() -> None:
    columns = [
        pa.array([5, 5, -1], pa.int64()),
        pa.array([5, 5, 7], pa.uint64()),
        pa.array([3, 3, 4], pa.int8()),
        pa.array(["é", "é", "e"], pa.string()),
        pa.array([b"\x00a", b"\x00a", b"a"], pa.binary()),
        pa.array([Decimal("1.10"), Decimal("1.10"), Decimal("-1.10")], pa.decimal128(20, 2)),
        pa.array([dt.date(2024, 2, 29)] * 2 + [dt.date(1000, 1, 1)]),
        pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, 1)] * 2 + [dt.datetime(1970, 1, 1)], pa.timestamp("us", "UTC")),
        pa.array([1.5, 1.5, 2.5], pa.float64()),
        pa.array(["ab", "ab", "ba"]).cast(pa.string_view()),
    ]
    for col in columns:
        h = key_hash([col])
        assert h[0] == h[1] != h[2], col.type
    # a slice hashes like the same values in a fresh array (buffer offsets are honoured)
    s = pa.array(["zz", "abc", "", "abc"])
    assert list(key_hash([s.slice(1)])) == list(key_hash([pa.array(["abc", "", "abc"])]))
    # the column order and every column count
    a, b = pa.array([1, 2]), pa.array([2, 1])
    assert key_hash([a, b])[0] != key_hash([b, a])[0]


def test_buckets_are_even_and_bounded() -> None:
    for col in (pa.array(range(200_000)), pa.array([f"order-{i:08d}" for i in range(200_000)])):
        counts = np.bincount(key_buckets([col], 16), minlength=16)
        assert counts.min() > 200_000 / 16 * 0.9 and counts.max() < 200_000 / 16 * 1.1
    assert set(key_buckets([pa.array(range(1000))], 1)) == {0}
    assert buckets_for(0, 1) == 1
    assert buckets_for(100 * 2**20, 400 * 2**20) == 1
    assert buckets_for(1000 * 2**20, 400 * 2**20) == 10
