"""Split a table into primary-key chunks by querying the source (docs/architecture.md, "Chunk splitting").

The decisions are pure (:mod:`airflow_provider_mysqlcdc.core.chunking`); this module runs the
queries: min/max, a per-bucket row histogram for the even path, ``ORDER BY key LIMIT n, 1`` for the
uneven path. Boundary comparisons are made by the database, so its collation decides.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from typing import Any

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.chunk import DEFAULT_CHUNK_SIZE, SnapshotChunk
from airflow_provider_mysqlcdc.core.chunking import (
    DEFAULT_MAX_DISTRIBUTION_FACTOR,
    DEFAULT_MIN_DISTRIBUTION_FACTOR,
    arithmetic_boundaries,
    bucket_width,
    distribution_factor,
    even_split_applies,
    pack_buckets,
    splits_from_boundaries,
    unique_int_width,
)
from airflow_provider_mysqlcdc.core.keys import Collation, KeyColumn
from airflow_provider_mysqlcdc.core.predicate import quote_ident, range_condition, sql_literal
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.mysql.collation import fetch_collation, verify_collation

log = logging.getLogger(__name__)


@dataclass
class SplitOptions:
    chunk_size: int = DEFAULT_CHUNK_SIZE
    chunk_key_columns: list[str] | None = None
    min_distribution_factor: float = DEFAULT_MIN_DISTRIBUTION_FACTOR
    max_distribution_factor: float = DEFAULT_MAX_DISTRIBUTION_FACTOR

    def __post_init__(self) -> None:
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {self.chunk_size!r}")


@dataclass
class TableSplitResult:
    schema: TableSchema
    key_columns: list[KeyColumn]
    splits: list[SnapshotChunk]
    method: str  # "even", "uneven" or "empty"
    approx_rows: int
    seconds: float
    collations: dict[str, Collation] = field(default_factory=dict)


def load_collations(conn: Any, key_columns: list[KeyColumn], cache: dict[str, Collation]) -> dict[str, Collation]:
    out = {}
    for col in key_columns:
        if col.kind == keys.STRING and col.collation:
            if col.collation not in cache:
                cache[col.collation] = fetch_collation(conn, col.collation)
            out[col.collation] = cache[col.collation]
    return out


def split_table(
    conn: Any,
    schema: TableSchema,
    options: SplitOptions | None = None,
    collation_cache: dict[str, Collation] | None = None,
) -> TableSplitResult:
    opts = options or SplitOptions()
    t0 = time.monotonic()
    key_cols = schema.chunk_key(opts.chunk_key_columns)
    collations = load_collations(conn, key_cols, collation_cache if collation_cache is not None else {})
    splitter = _TableSplitter(conn, schema, key_cols, opts, collations)
    boundaries, method, approx = splitter.boundaries()
    if collations:
        for coll in collations.values():
            idx = [i for i, c in enumerate(key_cols) if c.collation == coll.name]
            verify_collation(conn, coll, [b[i] for b in boundaries for i in idx])
    splits = splits_from_boundaries(str(schema.table), key_cols, boundaries)
    secs = time.monotonic() - t0
    log.info("%s: %d chunks (%s split, ~%d rows) in %.2fs", schema.table, len(splits), method, approx, secs)
    return TableSplitResult(schema, key_cols, splits, method, approx, secs, collations)


class _TableSplitter:
    def __init__(
        self,
        conn: Any,
        schema: TableSchema,
        key_cols: list[KeyColumn],
        opts: SplitOptions,
        collations: dict[str, Collation],
    ):
        self.conn = conn
        self.schema = schema
        self.key_cols = key_cols
        self.opts = opts
        self.collations = collations
        self.qtable = schema.table.quoted
        self.qkeys = ", ".join(quote_ident(c.name) for c in key_cols)
        # Boundary values are read back and compared again, so they must be exact. The server shows
        # a FLOAT with 6 significant digits (many stored values share one text), which made the
        # uneven loop never advance; CAST AS DOUBLE gives the stored value exactly. BIT comes as
        # bytes and TIME as a timedelta that drops a negative fraction's sign in some clients:
        # their number and text are the key values.
        self.qselect = ", ".join(_key_select(c) for c in key_cols)

    def _query(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def _approx_rows(self) -> int:
        rows = self._query(
            "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s",
            (self.schema.table.database, self.schema.table.table),
        )
        est = int(rows[0][0] or 0) if rows else 0
        if est < 100_000:  # small or never analyzed: an exact count is cheap and better
            est = int(self._query(f"SELECT COUNT(*) FROM {self.qtable}")[0][0])
        return est

    def boundaries(self) -> tuple[list[tuple[Any, ...]], str, int]:
        first = self.key_cols[0]
        if len(self.key_cols) == 1 and first.kind in (keys.INT, keys.DECIMAL):
            k = quote_ident(first.name)
            lo, hi = self._query(f"SELECT MIN({k}), MAX({k}) FROM {self.qtable}")[0]
            if lo is None:
                return [], "empty", 0
            rows = self._approx_rows()
            factor = distribution_factor(lo, hi, rows)
            if even_split_applies(factor, self.opts.min_distribution_factor, self.opts.max_distribution_factor):
                return self._even(lo, hi, factor), "even", rows
            return self._uneven(None, None), "uneven", rows
        rows = self._approx_rows()
        if rows == 0:
            return [], "empty", 0
        return self._uneven(None, None), "uneven", rows

    # ------------------------------------------------------------------ even path
    def _even(self, lo: Any, hi: Any, factor: float) -> list[tuple[Any, ...]]:
        col = self.key_cols[0]
        k = quote_ident(col.name)
        scale = 0
        if col.kind == keys.DECIMAL:
            scale = self.schema.column(col.name).numeric_scale or 0
        unique = [c.name for c in self.key_cols] == list(self.schema.primary_key)
        if col.kind == keys.INT and unique:
            fast = unique_int_width(factor, self.opts.chunk_size)
            if fast is not None:  # dense unique ids: arithmetic alone keeps the bound, no scan
                return [(b,) for b in arithmetic_boundaries(int(lo), int(hi), fast)]
        width = bucket_width(factor, self.opts.chunk_size, scale)
        if col.kind == keys.INT and scale == 0:
            # DIV on integers is exact for the whole BIGINT UNSIGNED range (no float rounding).
            sql = f"SELECT ({k} - %s) DIV %s AS b, COUNT(*) FROM {self.qtable} GROUP BY b ORDER BY b"
        else:
            sql = f"SELECT FLOOR(({k} - %s) / %s) AS b, COUNT(*) FROM {self.qtable} GROUP BY b ORDER BY b"
        hist = self._query(sql, (lo, width))
        with localcontext() as ctx:
            ctx.prec = 100
            base = Decimal(lo) if col.kind == keys.DECIMAL else int(lo)
            buckets = [(base + int(b) * width, base + (int(b) + 1) * width, int(n)) for b, n in hist]
        segments = pack_buckets(buckets, self.opts.chunk_size)
        out: list[tuple[Any, ...]] = []
        for i, seg in enumerate(segments):
            if i > 0:
                out.append((seg.lo,))
            if seg.oversize:
                out.extend(self._uneven((seg.lo,), (seg.hi,) if seg.hi is not None else None))
        return out

    # ---------------------------------------------------------------- uneven path
    def _uneven(self, start: tuple[Any, ...] | None, end: tuple[Any, ...] | None) -> list[tuple[Any, ...]]:
        """Boundaries strictly inside ``[start, end)``, every ``chunk_size`` rows in key order."""
        n = self.opts.chunk_size
        out: list[tuple[Any, ...]] = []
        cur = start
        while True:
            cond = range_condition(self.key_cols, cur, end, self.collations)
            rows = self._query(
                f"SELECT {self.qselect} FROM {self.qtable} WHERE {cond} ORDER BY {self.qkeys} LIMIT {n}, 1"
            )
            if not rows:
                return out
            nxt = tuple(rows[0])
            if cur is not None and self._same(nxt, cur):
                # More than chunk_size rows share one key value (non-unique chunk key): the chunk
                # must hold all of them; move to the next distinct key.
                cond = range_condition(self.key_cols, cur, end, self.collations)
                more = self._query(
                    f"SELECT {self.qselect} FROM {self.qtable} WHERE {cond} AND NOT ({self._eq(cur)}) "
                    f"ORDER BY {self.qkeys} LIMIT 1"
                )
                if not more:
                    return out
                nxt = tuple(more[0])
            out.append(nxt)
            cur = nxt

    def _eq(self, values: tuple[Any, ...]) -> str:
        return " AND ".join(
            f"{quote_ident(c.name)} = {sql_literal(c, v, self.collations)}"
            for c, v in zip(self.key_cols, values, strict=True)
        )

    def _same(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
        """Equality as the database sees it (collation-aware), asked of the database."""
        if all(c.kind != keys.STRING for c in self.key_cols):
            return a == b
        pairs = " AND ".join(
            f"{sql_literal(c, x, self.collations)} COLLATE {c.collation} = {sql_literal(c, y, self.collations)}"
            if c.kind == keys.STRING
            else f"{sql_literal(c, x, self.collations)} = {sql_literal(c, y, self.collations)}"
            for c, x, y in zip(self.key_cols, a, b, strict=True)
        )
        return bool(self._query(f"SELECT {pairs}")[0][0])


_KEY_CASTS = {keys.FLOAT: "DOUBLE", keys.BIT: "UNSIGNED", keys.TIME: "CHAR"}


def _key_select(col: KeyColumn) -> str:
    """How a key column is read back as an exact key value."""
    cast = _KEY_CASTS.get(col.kind)
    return f"CAST({quote_ident(col.name)} AS {cast})" if cast else quote_ident(col.name)
