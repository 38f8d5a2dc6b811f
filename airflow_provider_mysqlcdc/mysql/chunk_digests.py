"""The source side of ``verify``: chunk digests computed by the server, and the digests of single
rows by key (to take rows that changed while verifying out of the comparison).

Everything runs on the caller's connection, inside the consistent-snapshot transaction it opened,
so every number describes the source at one binlog offset. One aggregate query per chunk: the
whole table is scanned once, on the server, and only two numbers per chunk travel.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import Collation, KeyColumn
from airflow_provider_mysqlcdc.core.predicate import quote_ident, split_condition, sql_literal
from airflow_provider_mysqlcdc.core.row_digest import MASK64, ChunkDigest, DigestPlan, normal_key
from airflow_provider_mysqlcdc.core.table import TableId

KEYS_PER_QUERY = 500


def source_chunk_digests(
    conn: Any, table: str, splits: Sequence[SnapshotChunk], plan: DigestPlan, collations: dict[str, Collation]
) -> list[ChunkDigest]:
    """``(rows, digest sum)`` of every chunk of ``table``, in ``splits`` order."""
    tid = TableId.parse(table)
    out = []
    with conn.cursor() as cur:
        select = f"SELECT {plan.sql_chunk_aggregate()} FROM {tid.quoted} WHERE "
        for split in splits:
            cur.execute(select + split_condition(split, collations))
            rows, total = cur.fetchone()
            out.append(ChunkDigest(int(rows), int(total) & MASK64))
    return out


def source_row_digests(
    conn: Any,
    table: str,
    key_columns: Sequence[KeyColumn],
    keys: Iterable[tuple[Any, ...]],
    plan: DigestPlan,
    collations: dict[str, Collation],
) -> dict[tuple[Any, ...], int]:
    """The digest of each row that exists with one of ``keys`` (absent keys are absent)."""
    tid = TableId.parse(table)
    names = ", ".join(quote_ident(c.name) for c in key_columns)
    wanted = list(keys)
    out: dict[tuple[Any, ...], int] = {}
    with conn.cursor() as cur:
        for i in range(0, len(wanted), KEYS_PER_QUERY):
            batch = wanted[i : i + KEYS_PER_QUERY]
            values = ", ".join(
                "(" + ", ".join(sql_literal(c, v, collations) for c, v in zip(key_columns, k, strict=True)) + ")"
                for k in batch
            )
            cur.execute(f"SELECT {names}, {plan.sql_row_digest()} FROM {tid.quoted} WHERE ({names}) IN ({values})")
            for row in cur.fetchall():
                out[normal_key(row[:-1])] = int(row[-1])
    return out


__all__ = ["source_chunk_digests", "source_row_digests"]
