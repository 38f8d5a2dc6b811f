"""Delta commits of data files written elsewhere: their add and remove actions, and the commit itself.

Why its own module: the snapshot commits adopt Parquet files written elsewhere (by Spark) instead
of writing through delta-rs, so the actions — relative paths, partition values of a routed shard,
row counts and the statistics the table declares (``sinks/delta_stats.py``) — are built here by hand.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from airflow_provider_mysqlcdc import storage as lake_storage
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS, RoutedTable
from airflow_provider_mysqlcdc.sinks.delta_merge import delta_arrow_schema
from airflow_provider_mysqlcdc.sinks.delta_schema import column_signature
from airflow_provider_mysqlcdc.sinks.delta_stats import declared_stats_columns, exact_json, file_stats, merge_range

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink

log = logging.getLogger(__name__)

#: A commit's file actions: the removes and the adds.
FileActions = tuple[list[RemoveAction], list[AddAction]]

#: Commit-info key identifying one commit of this package (its version is looked up by it).
COMMIT_ID = "mysqlcdc.commit"


def remove_action(path: str, size: int, now: int) -> RemoveAction:
    return RemoveAction(path=path, data_change=True, deletion_timestamp=now, size=size)


def add_actions(
    uri: str,
    files: list[StagedFile],
    stats_columns: list[str] | None,
    now: int,
    prefix: str | None = None,
    storage: lake_storage.LakeStorage = lake_storage.LOCAL,
    route: RoutedTable | None = None,
) -> list[AddAction]:
    adds = []
    for f in files:
        rel = relative_path(uri, f.path)
        if prefix is not None and not rel.startswith(prefix):
            raise ValueError(f"staged file {f.path} is not under {uri}/{prefix}")
        adds.append(
            AddAction(
                path=rel,
                size=f.size,
                partition_values=route.partition_values if route else {},
                modification_time=now,
                data_change=True,
                stats=stats_json(f.path, f.rows, stats_columns, storage),
            )
        )
    return adds


def relative_path(table_uri: str, path: str) -> str:
    t = table_uri.rstrip("/") + "/"
    for cand in (path, path.replace("file://", "", 1), os.path.abspath(path) if "://" not in path else path):
        if cand.startswith(t):
            return cand[len(t):]
    t_abs = os.path.abspath(table_uri).rstrip("/") + "/"
    p_abs = os.path.abspath(path.replace("file:", "", 1).lstrip("/") if path.startswith("file:") else path)
    if p_abs.startswith(t_abs):
        return p_abs[len(t_abs):]
    raise ValueError(f"{path} is not inside table {table_uri}")


def stats_json(path: str, rows: int, columns: list[str] | None, storage: lake_storage.LakeStorage) -> str:
    """Delta file statistics: row count, and min/max of the table's stats columns (see
    :mod:`sinks.delta_stats`) from the Parquet footer, for data skipping in MERGE and readers."""
    ranges: dict[str, tuple[Any, Any, int]] = {}
    if columns and rows:
        try:
            md = storage.parquet_file(path).metadata
            names = md.schema.names
            for col in columns:
                if col not in names:
                    break
                ci = names.index(col)
                for rg in range(md.num_row_groups):
                    st = md.row_group(rg).column(ci).statistics
                    if st is None or not st.has_min_max or not exact_json(st.min) or not exact_json(st.max):
                        ranges.pop(col, None)
                        break
                    merge_range(ranges, col, st.min, st.max, st.null_count if st.has_null_count else 1)
        except (OSError, ValueError) as exc:  # stats are an optimisation; never fail a commit on them
            log.debug("no stats for %s: %s", path, exc)
            ranges = {}
    return file_stats(rows, ranges, columns)


def commit_file_actions(
    sink: DeltaSink,
    table: str,
    actions: Callable[[dict[str, int], int, list[str] | None], FileActions],
    schema: pa.Schema,
    metadata: dict[str, Any],
    skip_if_unchanged: bool,
    new_schema: bool = False,
) -> tuple[int | None, int, int]:
    """Commit ``actions(current files, now, stats columns)`` as one transaction, retrying on a
    concurrent commit (the stats columns: those the table declares, :mod:`sinks.delta_stats`).

    ``new_schema``: the files replace the whole table and ``schema`` becomes its schema (a
    re-snapshot of a table whose columns changed: delta-rs writes the new metadata only in
    overwrite mode).

    Every attempt re-reads the table and recomputes its actions, so a retry after a conflict (a
    version taken, or a MERGE that rewrote files this commit read) is safe.
    """
    route = sink.route_of(table)
    if route and new_schema:  # a shard's re-snapshot fits the shared schema (or widens it); never replaces it
        sink._check_shard_schema(table, route, schema)
        new_schema = False
    schema = sink.lake_schema(table, schema)
    from airflow_provider_mysqlcdc.sinks.delta_dv_purge import purge_deletion_vectors  # it builds on this module

    for attempt in range(20):
        dt = sink.open(table)
        sink.check_owner(table, dt)
        if purge_deletion_vectors(sink, table, dt):  # these actions name files by path alone
            dt = sink.open(table)
        have = sink.table_files(table, dt)
        if route:  # other shards may have added columns this shard's files lack (NULL there)
            schema = delta_arrow_schema(dt)
        changed = new_schema and column_signature(delta_arrow_schema(dt)) != column_signature(schema)
        # an overwrite removes every current file itself: add them all, remove none
        stats_columns = declared_stats_columns(dt.metadata().configuration)
        removes, adds = actions({} if changed else have, int(time.time() * 1000), stats_columns)
        if skip_if_unchanged and not removes and not adds and not changed:
            return None, 0, 0
        commit_id = uuid.uuid4().hex
        try:
            dt.create_write_transaction(
                [*removes, *adds],
                mode="overwrite" if changed else "append",
                schema=schema,
                partition_by=list(SOURCE_COLUMNS) if route else None,
                commit_properties=CommitProperties(
                    custom_metadata={"mysqlcdc": json.dumps(metadata), COMMIT_ID: commit_id}
                ),
            )
            return _committed_version(sink, table, commit_id), len(removes), len(adds)
        except Exception as exc:
            text = str(exc).lower()
            retryable = ("version" in text and "exist" in text) or type(exc).__name__ == "CommitFailedError"
            if retryable and attempt < 19:
                time.sleep(0.05 * (attempt + 1))
                continue
            raise
    raise RuntimeError(f"could not commit to {table}: 20 concurrent-commit conflicts in a row")


def _committed_version(sink: DeltaSink, table: str, commit_id: str) -> int:
    """The version this process's commit got: concurrent groups commit to the same table, so the
    latest version may be another group's, and delta-rs returns none. Read from the log itself
    (its ``history()`` numbered entries wrongly right after concurrent commits on S3)."""
    log_dir = f"{sink.table_uri(table)}/_delta_log"
    names = [n for n in sink.storage.listdir(log_dir) if n.endswith(".json") and n[:-5].isdigit()]
    for name in sorted(names, reverse=True)[:50]:  # the log file's name is its version
        with sink.storage.open(f"{log_dir}/{name}", "rb") as f:
            if commit_id.encode() in f.read():
                return int(name[:-5])
    raise RuntimeError(f"{table}: commit {commit_id} is not among the table's last 50 commits")


__all__ = [
    "COMMIT_ID",
    "FileActions",
    "add_actions",
    "commit_file_actions",
    "relative_path",
    "remove_action",
    "stats_json",
]
