"""Row digests on plain data: the Arrow side's text per canonical kind, and the chunk arithmetic.

That the server renders the same text is proven against MariaDB by tests/integration/test_verify.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from decimal import Decimal

import pyarrow as pa

from airflow_provider_mysqlcdc.core.row_digest import (
    MASK64,
    ChunkDigest,
    DigestPlan,
    compare_chunks,
    format_verdicts,
    lake_chunk_digests,
    row_digest,
)
from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema
from airflow_provider_mysqlcdc.core.types import arrow_schema

COLS = [
    ColumnInfo("id", 1, "bigint", "bigint(20)", False),
    ColumnInfo("amount", 2, "decimal", "decimal(12,2)", True, numeric_precision=12, numeric_scale=2),
    ColumnInfo("at", 3, "datetime", "datetime(6)", True, datetime_precision=6),
    ColumnInfo("day", 4, "date", "date", True),
    ColumnInfo("raw", 5, "varbinary", "varbinary(8)", True),
    ColumnInfo("flag", 6, "bit", "bit(1)", True),
    ColumnInfo("ratio", 7, "double", "double", True),
    ColumnInfo("note", 8, "varchar", "varchar(20)", True, charset="utf8mb4"),
]
SCHEMA = TableSchema(TableId("d", "t"), COLS, ["id"])


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=arrow_schema(SCHEMA))


def test_each_kind_renders_its_canonical_text_and_floats_are_left_out() -> None:
    plan = DigestPlan.of(SCHEMA)
    assert plan.unchecked == {"ratio": "DOUBLE text differs between the server and Python"}
    t = _table([
        {"id": 5, "amount": Decimal("1.50"), "at": dt.datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=dt.UTC),
         "day": dt.date(1970, 1, 2), "raw": b"\x01\xab", "flag": True, "ratio": 0.1, "note": "ünï"},
        {"id": -7, "amount": None, "at": None, "day": None, "raw": None, "flag": False, "ratio": None, "note": None},
    ])  # fmt: skip
    assert plan.arrow_row_texts(t).to_pylist() == [
        "5\x1f1.50\x1f1000005\x1f1\x1f01AB\x1f1\x1fünï",
        "-7\x1f\x1e\x1f\x1e\x1f\x1e\x1f\x1e\x1f0\x1f\x1e",
    ]


def test_digest_is_the_first_64_bits_of_md5_and_chunks_sum_modulo_2_64() -> None:
    assert row_digest("a") == int(hashlib.md5(b"a").hexdigest()[:16], 16)
    c = ChunkDigest()
    c.add(MASK64)
    c.add(5)
    assert (c.rows, c.digest) == (2, 4)
    c.add(5, sign=-1)
    assert c == ChunkDigest(1, MASK64)


def test_lake_digests_leave_out_excluded_keys_and_compare_names_the_chunk() -> None:
    plan = DigestPlan.of(SCHEMA)
    t = _table([{"id": i, "flag": True} for i in range(10)])
    by_tens = lambda keys: [0 if k[0] < 5 else 1 for k in keys]  # noqa: E731
    lake, left_out = lake_chunk_digests(t, plan, by_tens, ["id"], 2, excluded={(7,)})
    assert left_out == 1 and [c.rows for c in lake] == [5, 4]
    full, _ = lake_chunk_digests(t, plan, by_tens, ["id"], 2)
    verdict = compare_chunks("d.t", full, lake, ["[-inf .. 5)", "[5 .. +inf)"])
    assert verdict.differing == [1] and not verdict.ok
    assert verdict.details == [{"chunk": 1, "range": "[5 .. +inf)", "source_rows": 5, "lake_rows": 4}]
    assert "d.t" in format_verdicts([verdict]) and "differing" in format_verdicts([verdict])
