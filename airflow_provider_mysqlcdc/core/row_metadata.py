"""Metadata columns on the mirror tables (``metadata_columns``; docs/architecture.md, "Metadata columns").

Why per row: "which change last wrote this row, and when" is the first question of anyone
reconciling a lake table with its source or with downstream tables, and the binlog position is
the only answer that orders changes exactly. Every mirror row carries the event that last wrote
it, whatever wrote it:

    _op           'r' the snapshot, 'c' an insert, 'u' an update (a delete removes the row)
    _commit_ts    the change's binlog event time, UTC (a snapshot row: when its group's HW was taken)
    _binlog_file, _binlog_pos   where the change's transaction starts (a snapshot row: its group's HW)

These are the same values as the row's latest version in the changelog (``core/changelog.py``).
Pure logic: Arrow only.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core.offset import BinlogOffset

TIMESTAMP = pa.timestamp("us", tz="UTC")
METADATA_FIELDS = [
    pa.field("_op", pa.string()),
    pa.field("_commit_ts", TIMESTAMP),
    pa.field("_binlog_file", pa.string()),
    pa.field("_binlog_pos", pa.int64()),
]
METADATA_COLUMNS = tuple(f.name for f in METADATA_FIELDS)


def lake_schema(table_schema: pa.Schema, metadata_columns: bool) -> pa.Schema:
    """The mirror table's schema: the source's canonical columns, then the metadata columns if on."""
    return pa.schema([*table_schema, *METADATA_FIELDS]) if metadata_columns else table_schema


def reserved_columns(column_names: Iterable[str]) -> list[str]:
    """The source columns that clash with the metadata columns (compared case-insensitively, as
    MySQL and Spark compare column names)."""
    reserved = {c.lower() for c in METADATA_COLUMNS}
    return [c for c in column_names if c.lower() in reserved]


def with_snapshot_metadata(rows: pa.Table, high_watermark: BinlogOffset, taken_at: float) -> pa.Table:
    """``rows`` of a snapshot group (at its HW) with the metadata columns: op 'r' at the HW."""
    n = rows.num_rows
    meta = [
        pa.array(["r"] * n, pa.string()),
        pa.array([int(taken_at * 1_000_000)] * n, pa.int64()).cast(TIMESTAMP),
        pa.array([high_watermark.file] * n, pa.string()),
        pa.array([high_watermark.pos] * n, pa.int64()),
    ]
    base = rows.drop_columns([c for c in METADATA_COLUMNS if c in rows.column_names])
    return pa.Table.from_arrays([*base.columns, *meta], schema=pa.schema([*base.schema, *METADATA_FIELDS]))


def change_metadata(op: pa.Array, commit_ts: pa.Array, file: pa.Array, pos: pa.Array) -> list[pa.Array]:
    """The metadata columns of the changes that won a fold (their block columns, in the fold's order)."""
    ts = pc.multiply(commit_ts.cast(pa.int64()), 1_000_000).cast(TIMESTAMP)
    return [op.cast(pa.string()), ts, file.cast(pa.string()), pos.cast(pa.int64())]


__all__ = ["METADATA_COLUMNS", "METADATA_FIELDS", "change_metadata", "lake_schema", "reserved_columns",
           "with_snapshot_metadata"]  # fmt: skip
