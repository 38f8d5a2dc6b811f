"""Change blocks: the vectorised fold agrees with ``fold_changes`` (the readable reference).

Random op sequences over a tiny key space (collisions, key moves, keys equal under a
case-/pad-insensitive collation but distinct as stored values) go through a block (Arrow IPC and
back) and through ``fold_changes``; both must give the same upserts and delete keys as sets, and
every key must end in exactly one of the two.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_mysqlcdc.core import change_block
from airflow_provider_mysqlcdc.core.change_block import (
    BlockBuilder,
    block_changes,
    block_schema,
    decode_blocks,
    encode_block,
    fold_block,
)
from tests.support.reference_fold import fold_changes

PK = ["a", "b"]
SCHEMA = pa.schema([
    pa.field("a", pa.int64(), nullable=False),
    pa.field("b", pa.string(), nullable=False),
    pa.field("v", pa.int64()),
    pa.field("d", pa.decimal128(12, 2)),
])  # fmt: skip
KEYS = [(a, b) for a in (0, 1, 2) for b in ("x", "X", "x ")]


def _row(key: tuple[Any, ...], v: int) -> dict[str, Any]:
    return {"a": key[0], "b": key[1], "v": v, "d": Decimal(v).scaleb(-2)}


def _block(changes: list[tuple[str, Any, Any]], full_before: bool, per_block: int) -> pa.Table:
    schema = block_schema(SCHEMA, PK, full_before)
    b = BlockBuilder(schema)
    blobs = []
    for i, (op, before, after) in enumerate(changes):
        b.add(op, "mysql-bin.000001", 4 + i, 1, 100 + i, 0, i, 1_700_000_000, before, after)
        if len(b) >= per_block:
            blobs.append(encode_block(b.build()))
    if len(b):
        blobs.append(encode_block(b.build()))
    blobs.reverse()  # blocks arrive in any order: decode_blocks restores seq order
    data = decode_blocks(blobs)
    assert data is not None
    return data


change = st.tuples(st.sampled_from(["c", "u", "d", "u*"]), st.sampled_from(KEYS), st.sampled_from(KEYS),
                   st.integers(0, 99))  # fmt: skip


def _changes(spec: list[tuple[str, Any, Any, int]]) -> list[tuple[str, Any, Any]]:
    out = []
    for op, k1, k2, v in spec:
        if op == "c":
            out.append(("c", None, _row(k1, v)))
        elif op == "u":
            out.append(("u", _row(k1, v + 1), _row(k2, v)))
        elif op == "u*":  # an update whose delete-half the handoff filter dropped
            out.append(("u", None, _row(k2, v)))
        else:
            out.append(("d", _row(k1, v), None))
    return out


@settings(max_examples=300, deadline=None)
@given(spec=st.lists(change, max_size=40), full_before=st.booleans(), per_block=st.integers(1, 8),
       vectorised=st.booleans())  # fmt: skip
def test_fold_block_equals_fold_changes(spec: list[Any], full_before: bool, per_block: int, vectorised: bool) -> None:
    """Both paths: the few-changes one (a dict over the keys) and the vectorised one."""
    changes = _changes(spec)
    ref_ups, ref_dels = fold_changes([("c" if op == "u" and b is None else op, b, a) for op, b, a in changes], PK)
    if not changes:
        return
    few = change_block.FEW_CHANGES
    change_block.FEW_CHANGES = 0 if vectorised else 64
    try:
        ups, dels = fold_block(_block(changes, full_before, per_block), PK)
    finally:
        change_block.FEW_CHANGES = few
    assert ups.schema == SCHEMA
    assert dels.schema == pa.schema([SCHEMA.field("a"), SCHEMA.field("b")])
    got_ups = {(r["a"], r["b"]): r for r in ups.to_pylist()}
    assert got_ups == {(r["a"], r["b"]): r for r in ref_ups}
    assert len(got_ups) == ups.num_rows
    got_dels = [(r["a"], r["b"]) for r in dels.to_pylist()]
    assert sorted(got_dels) == sorted(ref_dels) and len(set(got_dels)) == len(got_dels)
    assert not set(got_dels) & set(got_ups)


def test_block_round_trip_keeps_types_and_order() -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("t", pa.timestamp("us", tz="UTC"))])
    b = BlockBuilder(block_schema(schema, ["id"]))
    ts = dt.datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=dt.UTC)
    b.add("u", "mysql-bin.000007", 1234, 7, 1300, 2, 5, 1_800_000_000, {"id": 1, "t": None}, {"id": 2, "t": ts})
    data = decode_blocks([encode_block(b.build())])
    assert data is not None
    (c,) = block_changes(data)
    assert c["before"] == {"id": 1}  # key-only before image: other columns are not carried
    assert c["after"] == {"id": 2, "t": ts}
    assert (c["op"], c["file"], c["pos"], c["file_num"], c["event_pos"], c["row_index"], c["seq"]) == (
        "u", "mysql-bin.000007", 1234, 7, 1300, 2, 5)  # fmt: skip
    assert len(b) == 0


@pytest.mark.parametrize("few_changes", [0, 64], ids=["vectorised", "few"])
def test_fold_block_rejects_malformed_changes(few_changes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(change_block, "FEW_CHANGES", few_changes)
    schema = block_schema(SCHEMA, PK)
    for op, before, after, msg in [
        ("x", None, _row(KEYS[0], 1), "unknown ops"),
        ("d", None, None, "delete without a before image"),
        ("c", None, None, "without an after image"),
    ]:
        b = BlockBuilder(schema)
        b.add(op, "mysql-bin.000001", 4, 1, 4, 0, 0, 0, before, after)
        with pytest.raises(ValueError, match=msg):
            fold_block(decode_blocks([encode_block(b.build())]), PK)  # type: ignore[arg-type]
    assert decode_blocks([]) is None


@pytest.mark.parametrize(
    ("arrow_type", "old", "new"),
    [
        (pa.decimal128(20, 0), Decimal(18446744073709551615), Decimal(2)),  # BIGINT UNSIGNED
        (pa.binary(), b"a\x00", b"a"),
        (pa.date32(), dt.date(2020, 1, 1), dt.date(2021, 1, 1)),
        (pa.timestamp("us", tz="UTC"), dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2020, 1, 1, 0, 0, 0, 1,
                                                                                            tzinfo=dt.UTC)),
        (pa.bool_(), False, True),
        (pa.float32(), 1.0, 2.0),
        (pa.int16(), -1, 1),
        (pa.string(), "a", "a "),  # distinct stored values, equal under PAD SPACE: two sink rows
    ],
)  # fmt: skip
@pytest.mark.parametrize("few_changes", [0, 64], ids=["vectorised", "few"])
def test_fold_block_handles_every_key_type(arrow_type: pa.DataType, old: Any, new: Any, few_changes: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(change_block, "FEW_CHANGES", few_changes)
    schema = pa.schema([pa.field("k", arrow_type, nullable=False), pa.field("v", pa.int64())])
    b = BlockBuilder(block_schema(schema, ["k"]))
    b.add("c", "mysql-bin.000001", 4, 1, 4, 0, 0, 0, None, {"k": old, "v": 1})
    b.add("u", "mysql-bin.000001", 4, 1, 4, 1, 1, 0, {"k": old, "v": 1}, {"k": new, "v": 2})  # key moves
    b.add("u", "mysql-bin.000001", 4, 1, 4, 2, 2, 0, {"k": new, "v": 2}, {"k": new, "v": 3})
    ups, dels = fold_block(decode_blocks([encode_block(b.build())]), ["k"])  # type: ignore[arg-type]
    assert ups.to_pylist() == [{"k": new, "v": 3}]
    assert dels.to_pylist() == [{"k": old}]
