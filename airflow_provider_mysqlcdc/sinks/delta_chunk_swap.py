"""Swap the rows of some chunks of a Delta table for a fresh snapshot of them, in ONE commit (repair).

Why one commit that rewrites files: the rows of a repaired chunk are spread over data files the
stream's MERGEs wrote, next to rows of other chunks. Each such file is rewritten without the
chunk's rows, and the commit removes the old files and adds the rewritten ones plus the chunk's
freshly snapshotted files — readers see the damaged rows until this commit and the repaired ones
after it, never both or neither. Files without a row of the chunks are not touched. Idempotent:
when every staged file is already in the table, the swap was committed before and nothing happens
(docs/architecture.md, "Repair").
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from deltalake.transaction import RemoveAction

from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.manifest import CapturedTable
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.row_digest import normal_key
from airflow_provider_mysqlcdc.sinks.delta_files import (
    FileActions,
    add_actions,
    commit_file_actions,
    relative_path,
    remove_action,
)

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink

log = logging.getLogger(__name__)

REPAIR_DIR = "repair"
#: Keys -> whether each row's chunk is being repaired.
RowsInChunks = Callable[[pa.Table], np.ndarray]


def replace_chunk_rows(
    sink: DeltaSink,
    table: str,
    in_chunks: RowsInChunks,
    key_columns: list[str],
    files: list[StagedFile],
    schema: pa.Schema,
    metadata: dict[str, Any],
) -> int | None:
    """One commit after which the rows ``in_chunks`` selects are exactly those of ``files``.

    ``in_chunks`` gets a table of the ``key_columns`` of one data file and returns a boolean mask of
    its rows whose key lies in a repaired chunk. Returns the new version, or None when the swap was
    committed before.
    """
    uri = sink.table_uri(table)
    wanted = {relative_path(uri, f.path): f for f in files}
    attempt = uuid.uuid4().hex[:12]
    counts = {"rewritten": 0, "rows_dropped": 0, "rows_kept": 0}

    def actions(have: dict[str, int], now: int, stats: list[str] | None) -> FileActions:
        if wanted and all(p in have for p in wanted):
            return [], []  # committed before: a retried finalize
        removes: list[RemoveAction] = []
        kept_files: list[StagedFile] = []
        counts.update(rewritten=0, rows_dropped=0, rows_kept=0)
        for n, (rel, size) in enumerate(sorted(have.items())):
            if rel in wanted:
                continue
            url = f"{uri}/{rel}"
            mask = np.asarray(in_chunks(sink.storage.read_parquet(url, columns=key_columns)), dtype=bool)
            if not mask.any():
                continue
            kept = _in_schema(sink.storage.read_parquet(url), schema).filter(pa.array(~mask))
            removes.append(remove_action(rel, size, now))
            counts["rewritten"] += 1
            counts["rows_dropped"] += int(mask.sum())
            counts["rows_kept"] += kept.num_rows
            if kept.num_rows:
                out = f"{uri}/{REPAIR_DIR}/{attempt}-{n:05d}.parquet"
                written = sink.storage.write_parquet(kept, out, compression="snappy")
                kept_files.append(StagedFile(out, kept.num_rows, written))
        adds = add_actions(uri, [*files, *kept_files], stats, now, storage=sink.storage,
                            route=sink.route_of(table))  # fmt: skip
        return removes, adds

    version, _, _ = commit_file_actions(sink, table, actions, schema, metadata, skip_if_unchanged=True)
    if version is None:
        log.info("%s: the repair's %d files are already in the table", table, len(files))
    else:
        log.info(
            "%s: repaired chunks swapped in as version %s: %d file(s) rewritten without the chunks' %d rows "
            "(%d rows of other chunks kept), %d repaired file(s) with %d rows added",
            table,
            version,
            counts["rewritten"],
            counts["rows_dropped"],
            counts["rows_kept"],
            len(files),
            sum(f.rows for f in files),
        )
    return version


def _in_schema(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """A data file's rows in the table's current schema (delta-rs writes string_view columns; a file
    older than an ADD COLUMN lacks the column: NULL, as a Delta reader sees it)."""
    names = data.column_names
    cols = [data.column(f.name).cast(f.type) if f.name in names else pa.nulls(data.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


def swap_chunk_rows(
    sink: DeltaSink,
    table: str,
    captured: CapturedTable,
    collations: dict[str, Collation],
    chunk_ids: list[int],
    files: list[StagedFile],
    schema: pa.Schema,
    metadata: dict[str, Any],
) -> int | None:
    """:func:`replace_chunk_rows` for the chunks ``chunk_ids`` of a captured table (its manifest
    entry gives every chunk's key range, so each row is placed as the stream places it)."""
    splits = sorted((c.chunk for c in captured.chunks), key=lambda s: s.split_id)
    locator = ChunkLocator(splits, collations)
    repaired = np.zeros(len(splits), dtype=bool)
    repaired[[i for i, s in enumerate(splits) if s.split_id in set(chunk_ids)]] = True
    key_columns = captured.chunk_key_columns

    def in_chunks(keys: pa.Table) -> np.ndarray:
        rows = [normal_key(k) for k in zip(*(keys.column(c).to_pylist() for c in key_columns), strict=True)]
        return repaired[np.asarray(locator.indexes_of(rows), dtype=np.int64)] if rows else np.zeros(0, dtype=bool)

    return replace_chunk_rows(sink, table, in_chunks, key_columns, files, schema, metadata)


def swap_keyed_rows(
    sink: DeltaSink,
    table: str,
    captured: CapturedTable,
    files: list[StagedFile],
    schema: pa.Schema,
    metadata: dict[str, Any],
) -> int | None:
    """:func:`replace_chunk_rows` for a partial backfill (``snapshot_filters``): the rows replaced
    are those whose key is among the staged rows' keys — the rows the filter selected, at their
    chunk's HW — and every other row of the table stays as it is (docs/architecture.md, "Partial
    backfill")."""
    key_columns = list(captured.merge_key)
    staged: set[tuple[object, ...]] = set()
    for f in files:
        keys = sink.storage.read_parquet(f.path, columns=key_columns)
        staged.update(normal_key(k) for k in zip(*(keys.column(c).to_pylist() for c in key_columns), strict=True))

    def in_chunks(keys: pa.Table) -> np.ndarray:
        cols = [keys.column(c).to_pylist() for c in key_columns]
        return np.fromiter((normal_key(k) in staged for k in zip(*cols, strict=True)), dtype=bool, count=keys.num_rows)

    log.info("%s: the partial backfill replaces %d rows (the staged keys)", table, len(staged))
    return replace_chunk_rows(sink, table, in_chunks, key_columns, files, schema, metadata)


__all__ = ["RowsInChunks", "replace_chunk_rows", "swap_chunk_rows", "swap_keyed_rows"]
