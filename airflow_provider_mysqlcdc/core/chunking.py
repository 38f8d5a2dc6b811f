"""Pure chunk-splitting math (the source layer runs the queries, this decides the boundaries).

Two paths, as in Flink CDC, with one change that keeps the memory bound honest:

* **Even** (a single integer/decimal chunk key whose distribution factor
  ``(max - min + 1) / rows`` lies within bounds): keys are cut into buckets of equal width
  ``factor × chunk_size``. Flink CDC emits those buckets as chunks directly; with clustered keys
  (two dense runs far apart) a bucket then holds many times ``chunk_size`` rows, and a chunk is
  held in one task's memory. We instead count rows per bucket with one GROUP BY over the index
  (the same cost as the uneven path's scan), pack adjacent buckets into chunks of at most
  ``chunk_size`` rows, and re-split any bucket holding more than ``2 × chunk_size`` rows with the
  uneven method. Arithmetic is done on Python integers/decimals, so keys near 2^64 neither overflow
  nor loop (Flink CDC #1031/#4117).
* **Uneven** (anything else): the next boundary is the key ``chunk_size`` rows after the current
  start, found by the database (``ORDER BY key LIMIT n, 1``) so its collation decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import KeyColumn

DEFAULT_MIN_DISTRIBUTION_FACTOR = 0.05
DEFAULT_MAX_DISTRIBUTION_FACTOR = 1000.0


def distribution_factor(min_key: int | Decimal, max_key: int | Decimal, rows: int) -> float:
    """``(max - min + 1) / rows``: 1.0 for dense ids, large for sparse ones."""
    if rows <= 0:
        return math.inf
    return float((Decimal(max_key) - Decimal(min_key) + 1) / Decimal(rows))


def even_split_applies(
    factor: float,
    lower: float = DEFAULT_MIN_DISTRIBUTION_FACTOR,
    upper: float = DEFAULT_MAX_DISTRIBUTION_FACTOR,
) -> bool:
    return lower <= factor <= upper


def bucket_width(factor: float, chunk_size: int, scale: int = 0) -> int | Decimal:
    """Width of one even-split bucket in key units, at least one unit of the key's scale.

    For integer keys an ``int`` >= 1; for DECIMAL(p, s) keys a ``Decimal`` rounded up to ``s``
    places (so bucket edges are valid column values).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    raw = Decimal(repr(factor)) * chunk_size
    if scale <= 0:
        return max(1, int(raw.to_integral_value(rounding=ROUND_CEILING)))
    quantum = Decimal(1).scaleb(-scale)
    return max(quantum, raw.quantize(quantum, rounding=ROUND_CEILING))


def unique_int_width(factor: float, chunk_size: int) -> int | None:
    """Bucket width that needs no row counting, for a *unique* integer key, or None.

    ``[a, a + w)`` holds at most ``w`` distinct integers, so with ``w <= 2 × chunk_size`` no chunk
    can break the memory bound whatever the real distribution is, and the histogram scan is
    skipped. That holds when the keys are dense enough (factor <= 2); the width is clamped to
    ``[chunk_size, 2 × chunk_size]`` so a wrong row estimate cannot make chunks tiny either.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if factor > 2.0:
        return None
    return min(2 * chunk_size, max(chunk_size, math.ceil(factor * chunk_size)))


def arithmetic_boundaries(lo: int, hi: int, width: int) -> list[int]:
    """``lo + w, lo + 2w, ...`` up to ``hi``: chunk starts after the first (Python ints: no overflow)."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    return list(range(lo + width, hi + 1, width))


@dataclass(frozen=True)
class Segment:
    """A run of adjacent buckets that becomes one chunk (or must be re-split if ``oversize``)."""

    lo: Any  # first key value of the segment's range (inclusive)
    hi: Any  # end of its range (exclusive), None if it is the last bucket's open end
    rows: int
    oversize: bool


def pack_buckets(buckets: Sequence[tuple[Any, Any, int]], chunk_size: int) -> list[Segment]:
    """Greedily pack ordered, non-empty buckets ``(lo, hi, rows)`` into segments.

    A segment holds at most ``chunk_size`` rows unless it is a single bucket, which is kept whole
    up to ``2 × chunk_size`` rows and flagged ``oversize`` beyond (the caller re-splits it).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out: list[Segment] = []
    cur_lo: Any = None
    cur_hi: Any = None
    cur_rows = 0
    for lo, hi, rows in buckets:
        if rows <= 0:
            continue
        if cur_rows and cur_rows + rows > chunk_size:
            out.append(Segment(cur_lo, lo, cur_rows, False))
            cur_rows = 0
        if rows > 2 * chunk_size:
            out.append(Segment(lo, hi, rows, True))
            cur_rows = 0
            continue
        if not cur_rows:
            cur_lo = lo
        cur_hi = hi
        cur_rows += rows
    if cur_rows:
        out.append(Segment(cur_lo, cur_hi, cur_rows, False))
    return out


def splits_from_boundaries(
    table: str, key_columns: Sequence[KeyColumn], boundaries: Sequence[tuple[Any, ...]]
) -> list[SnapshotChunk]:
    """Half-open splits ``(-inf, b0), [b0, b1), ..., [bn, +inf)`` from sorted, distinct boundaries."""
    cols = tuple(key_columns)
    edges: list[tuple[Any, ...] | None] = [None, *boundaries, None]
    return [
        SnapshotChunk(table, i, cols, edges[i], edges[i + 1]) for i in range(len(edges) - 1)
    ]
