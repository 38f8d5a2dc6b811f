"""Row digests that the source server and the lake compute alike, for ``verify``.

Why digests of a canonical text: the source can only be summarised where it lives (a SQL aggregate
over a chunk's key range, no rows leave the server), and the lake only from its Arrow values; both
must turn the same row into the same bytes. Each column is rendered as the text of its canonical
value (``core/types.py``) in a form both sides produce exactly: integers and decimals as their
digits, dates as days and times as microseconds since the epoch (as the JDBC snapshot reads them),
text as UTF-8, bytes as upper-case hex, NULL as ``\\x1e``; columns joined by ``\\x1f``. A row's
digest is the first 64 bits of the MD5 of that text; a chunk's is the count of its rows and the
sum of their digests modulo 2**64 — order-independent, and a duplicated or missing row changes
both. FLOAT/DOUBLE (their text differs between MySQL and Python) and GEOMETRY columns are left out
and reported (docs/architecture.md, "Verify"). Pure: SQL text and Arrow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core.table import TableSchema, quote_ident
from airflow_provider_mysqlcdc.core.types import ColumnType, column_types

MASK64 = (1 << 64) - 1
NULL_MARK = "\x1e"
SEPARATOR = "\x1f"
_UNIX_EPOCH_TO_DAYS = 719528  # TO_DAYS('1970-01-01')
_ZERO_DATE = "IF(YEAR({c}) = 0 OR MONTH({c}) = 0 OR DAYOFMONTH({c}) = 0, NULL, {v})"

#: kind -> SQL (``{c}`` = the quoted column) whose text is the canonical value's digest text.
_SQL_TEXT: dict[str, str] = {
    "int": "{c}",
    "year": "CAST({c} AS SIGNED)",
    "uint64": "{c}",
    "decimal": "{c}",
    "decimal_text": "{c}",
    "datetime": _ZERO_DATE.replace("{v}", "TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {c})"),
    "timestamp": "NULLIF(CAST(UNIX_TIMESTAMP({c}) * 1000000 AS SIGNED), 0)",
    "date": _ZERO_DATE.replace("{v}", f"TO_DAYS({{c}}) - {_UNIX_EPOCH_TO_DAYS}"),
    "time": "{c}",
    "string": "{c}",
    "json": "{c}",
    "enum": "{c}",
    "set": "{c}",
    "bytes": "HEX({c})",
    "bit1": "CAST({c} <> 0 AS UNSIGNED)",
    "bit": "CAST({c} AS UNSIGNED)",
    "bit64": "CAST({c} AS UNSIGNED)",
}
#: kinds left out of the digest, with why (reported as unchecked columns).
UNCHECKED_KINDS = {
    "float": "FLOAT text differs between the server and Python",
    "double": "DOUBLE text differs between the server and Python",
    "geometry": "GEOMETRY",
}


@dataclass(frozen=True)
class DigestPlan:
    """Which columns a table's digest covers, and the SQL that computes it on the server."""

    checked: tuple[ColumnType, ...]
    unchecked: dict[str, str]  # column -> why

    @classmethod
    def of(cls, schema: TableSchema) -> DigestPlan:
        checked, unchecked = [], {}
        for ct in column_types(schema):
            if ct.kind in _SQL_TEXT:
                checked.append(ct)
            else:
                unchecked[ct.name] = UNCHECKED_KINDS.get(ct.kind, ct.kind)
        return cls(tuple(checked), unchecked)

    def sql_row_digest(self) -> str:
        """SQL for one row's 64-bit digest (an unsigned BIGINT)."""
        parts = []
        for ct in self.checked:
            value = _SQL_TEXT[ct.kind].format(c=quote_ident(ct.name))
            parts.append(f"COALESCE(CONVERT(CAST({value} AS CHAR) USING utf8mb4), _utf8mb4 X'1e')")
        row = f"CONCAT_WS(_utf8mb4 X'1f', {', '.join(parts)})" if parts else "_utf8mb4 ''"
        return f"CAST(CONV(LEFT(MD5({row}), 16), 16, 10) AS UNSIGNED)"

    def sql_chunk_aggregate(self) -> str:
        """SELECT list of a chunk's (row count, digest sum); the sum is exact (DECIMAL) on the server."""
        return f"COUNT(*), COALESCE(SUM({self.sql_row_digest()}), 0)"

    def arrow_row_texts(self, table: pa.Table) -> pa.Array:
        """Each lake row's digest text (the server's, for the same canonical values)."""
        if not self.checked:
            return pa.array([""] * table.num_rows, pa.string())
        cols = [_arrow_text(table.column(ct.name), ct).fill_null(NULL_MARK) for ct in self.checked]
        if len(cols) == 1:
            return cols[0].combine_chunks() if isinstance(cols[0], pa.ChunkedArray) else cols[0]
        joined = pc.binary_join_element_wise(*cols, SEPARATOR)
        return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def row_digest(text: str) -> int:
    """The digest of one row's text: the first 64 bits of its MD5, as the server's CONV(LEFT(MD5()))."""
    return int.from_bytes(hashlib.md5(text.encode("utf-8")).digest()[:8], "big")


def _arrow_text(col: pa.ChunkedArray | pa.Array, ct: ColumnType) -> pa.ChunkedArray | pa.Array:
    k = ct.kind
    if k in ("datetime", "timestamp"):
        return col.cast(pa.int64()).cast(pa.string())
    if k == "date":
        return col.cast(pa.int32()).cast(pa.string())
    if k == "bit1":
        return col.cast(pa.int8()).cast(pa.string())
    if k == "bytes":
        values = col.to_pylist()
        return pa.array([None if v is None else v.hex().upper() for v in values], pa.string())
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col
    return col.cast(pa.string())


@dataclass
class ChunkDigest:
    """Rows and the digest sum of one chunk, on one side."""

    rows: int = 0
    digest: int = 0

    def add(self, digest: int, sign: int = 1) -> None:
        self.rows += sign
        self.digest = (self.digest + sign * digest) & MASK64

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChunkDigest) and (self.rows, self.digest) == (other.rows, other.digest)


def normal_key(values: Iterable[object]) -> tuple[object, ...]:
    """A key tuple comparable across the sides: the lake labels DATETIME keys UTC, the binlog and
    pymysql hand out naive values."""
    return tuple(v.replace(tzinfo=None) if isinstance(v, datetime) and v.tzinfo else v for v in values)


def lake_chunk_digests(
    table: pa.Table,
    plan: DigestPlan,
    chunk_of: Callable[[list[tuple[object, ...]]], Sequence[int]],
    key_names: Sequence[str],
    chunks: int,
    excluded: set[tuple[object, ...]] | frozenset[tuple[object, ...]] = frozenset(),
) -> tuple[list[ChunkDigest], int]:
    """Per-chunk digests of the lake's rows, leaving out the rows whose key is in ``excluded``;
    ``chunk_of`` maps keys to chunk indexes. Returns the digests and how many rows were left out."""
    if not table.num_rows:
        return [ChunkDigest() for _ in range(chunks)], 0
    key_cols = [table.column(c) for c in key_names]
    keys: list[tuple[object, ...]] = list(zip(*(c.to_pylist() for c in key_cols), strict=True))
    if any(pa.types.is_timestamp(c.type) for c in key_cols):
        keys = [normal_key(k) for k in keys]
    md5 = hashlib.md5
    digests = np.fromiter(
        (int.from_bytes(md5(t.encode()).digest()[:8], "big") for t in plan.arrow_row_texts(table).to_pylist()),
        dtype=np.uint64, count=table.num_rows,
    )  # fmt: skip
    idx = np.asarray(chunk_of(keys), dtype=np.int64)
    left_out = 0
    if excluded:
        keep = np.fromiter((k not in excluded for k in keys), dtype=bool, count=len(keys))
        left_out = int((~keep).sum())
        digests, idx = digests[keep], idx[keep]
    rows = np.bincount(idx, minlength=chunks)
    sums = np.zeros(chunks, dtype=np.uint64)
    np.add.at(sums, idx, digests)  # uint64 arithmetic wraps: the sum modulo 2**64
    return [ChunkDigest(int(r), int(d)) for r, d in zip(rows, sums, strict=True)], left_out


@dataclass
class TableVerdict:
    """One table's comparison: per chunk, which differ, and what was left out of it."""

    table: str
    chunks: int
    differing: list[int] = field(default_factory=list)  # chunk indexes (split ids)
    source_rows: int = 0
    lake_rows: int = 0
    in_flight_keys: int = 0  # changed while verifying: compared by the next run, not this one
    unchecked_columns: dict[str, str] = field(default_factory=dict)
    details: list[dict[str, object]] = field(default_factory=list)  # the first differing chunks

    @property
    def ok(self) -> bool:
        return not self.differing

    def to_dict(self) -> dict[str, object]:
        return {"table": self.table, "ok": self.ok, "chunks": self.chunks, "differing_chunks": self.differing,
                "source_rows": self.source_rows, "lake_rows": self.lake_rows, "in_flight_keys": self.in_flight_keys,
                "unchecked_columns": self.unchecked_columns, "details": self.details}  # fmt: skip


def compare_chunks(
    table: str, source: Sequence[ChunkDigest], lake: Sequence[ChunkDigest], bounds: Sequence[str], detail: int = 10
) -> TableVerdict:
    """Chunk-by-chunk comparison of the two sides (same chunk order on both)."""
    verdict = TableVerdict(table, len(source))
    for i, (s, lk) in enumerate(zip(source, lake, strict=True)):
        verdict.source_rows += s.rows
        verdict.lake_rows += lk.rows
        if s != lk:
            verdict.differing.append(i)
            if len(verdict.details) < detail:
                verdict.details.append({"chunk": i, "range": bounds[i], "source_rows": s.rows, "lake_rows": lk.rows})
    return verdict


def format_verdicts(verdicts: Iterable[TableVerdict]) -> str:
    """The per-table summary ``verify`` prints."""
    rows = [("table", "chunks", "differing", "source rows", "lake rows", "in flight", "unchecked columns")]
    for v in verdicts:
        rows.append((v.table, str(v.chunks), str(len(v.differing)), f"{v.source_rows:,}", f"{v.lake_rows:,}",
                     str(v.in_flight_keys), ", ".join(v.unchecked_columns) or "-"))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


__all__ = ["ChunkDigest", "DigestPlan", "TableVerdict", "compare_chunks", "format_verdicts", "lake_chunk_digests",
           "normal_key", "row_digest"]
