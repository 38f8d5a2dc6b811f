"""The columns a Delta table's data files carry min/max statistics for, and those statistics.

Why its own module: a reader that prunes files by their statistics must know which columns have
them. delta-rs' pyarrow dataset (``to_pyarrow_dataset``, ``to_pyarrow_table(filters=...)``) takes
every column the table indexes (by default its first 32) and, for a file whose statistics lack one,
guarantees ``col >= null``, which drops the file for any filter on that column. So each mirror
table declares the columns it has statistics for (its key columns of integer or string type: the
ones MERGE prunes on) and every file this package adds carries min/max for exactly those, or no
min/max at all. Correctness never depends on the declaration; it only decides what can be pruned.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

#: Table property naming the columns with statistics (Delta 3: a comma list, backquoted names).
STATS_COLUMNS = "delta.dataSkippingStatsColumns"
#: Table property: statistics for the first N columns (0: none), for a table with no stats column.
INDEXED_COLUMNS = "delta.dataSkippingNumIndexedCols"


def stats_columns_for(schema: pa.Schema, key: list[str]) -> list[str]:
    """The key columns worth statistics: integers and strings, whose JSON form is exact."""
    out = []
    for name in key:
        if name not in schema.names or "`" in name:
            continue
        t = schema.field(name).type
        if pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            out.append(name)
    return out


def exact_json(value: Any) -> bool:
    """Whether a Parquet statistic value goes to Delta's JSON statistics exactly (ints and strings)."""
    return isinstance(value, int | str) and not isinstance(value, bool)


def stats_properties(columns: list[str]) -> dict[str, str]:
    """The table properties declaring ``columns`` as the only ones with statistics."""
    if not columns:
        return {INDEXED_COLUMNS: "0"}
    return {STATS_COLUMNS: ",".join(f"`{c}`" for c in columns)}


def declared_stats_columns(configuration: Mapping[str, str] | None) -> list[str] | None:
    """The columns a table declares statistics for; None when it declares nothing (delta's default:
    its first 32 columns, which files of this package do not carry statistics for)."""
    conf = configuration or {}
    raw = conf.get(STATS_COLUMNS)
    if raw is None:
        return [] if conf.get(INDEXED_COLUMNS) == "0" else None
    names, cur, quoted = [], "", False
    for ch in raw:
        if ch == "`":
            quoted = not quoted
        elif ch == "," and not quoted:
            names.append(cur.strip())
            cur = ""
        else:
            cur += ch
    names.append(cur.strip())
    return [n for n in names if n]


def file_stats(rows: int, ranges: Mapping[str, tuple[Any, Any, int]], columns: list[str] | None) -> str:
    """A data file's statistics: its row count, and min/max of every one of ``columns`` when
    ``ranges`` (column -> ``(min, max, null count)``) has them all, without nulls — a file lacking
    any gets no min/max at all (key columns hold no nulls; a nullable one is simply not pruned)."""
    stats: dict[str, Any] = {"numRecords": rows}
    if rows and columns and all(c in ranges and ranges[c][0] is not None and not ranges[c][2] for c in columns):
        stats["minValues"] = {c: ranges[c][0] for c in columns}
        stats["maxValues"] = {c: ranges[c][1] for c in columns}
        stats["nullCount"] = dict.fromkeys(columns, 0)
    return json.dumps(stats)


def merge_range(ranges: dict[str, tuple[Any, Any, int]], column: str, lo: Any, hi: Any, nulls: int) -> None:
    """Widen ``ranges[column]`` by one part's range (``lo``/``hi`` None: the part is all nulls)."""
    have = ranges.get(column)
    if have is None:
        ranges[column] = (lo, hi, nulls)
        return
    a, b, n = have
    ranges[column] = (lo if a is None else a if lo is None else min(a, lo),
                      hi if b is None else b if hi is None else max(b, hi), n + nulls)  # fmt: skip


__all__ = [
    "INDEXED_COLUMNS",
    "STATS_COLUMNS",
    "declared_stats_columns",
    "exact_json",
    "file_stats",
    "merge_range",
    "stats_columns_for",
    "stats_properties",
]
