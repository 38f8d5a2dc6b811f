"""Delta add and remove actions for data files a commit adopts or drops (snapshot commits, swaps).

Why its own module: the snapshot commits adopt Parquet files written elsewhere (by Spark) instead
of writing through delta-rs, so the actions — relative paths, partition values of a routed shard,
row counts and key statistics for MERGE's file pruning — are built here by hand.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from deltalake.transaction import AddAction, RemoveAction

from airflow_provider_mysqlcdc import storage as lake_storage
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.routing import RoutedTable

log = logging.getLogger(__name__)


def remove_action(path: str, size: int, now: int) -> RemoveAction:
    return RemoveAction(path=path, data_change=True, deletion_timestamp=now, size=size)


def add_actions(
    uri: str,
    files: list[StagedFile],
    primary_key: list[str],
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
                stats=stats_json(f.path, f.rows, primary_key, storage),
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


def stats_json(path: str, rows: int, primary_key: list[str], storage: lake_storage.LakeStorage) -> str:
    """Delta file statistics: row count, and min/max of the key columns for data skipping in MERGE."""
    stats: dict[str, Any] = {"numRecords": rows}
    if primary_key and rows:
        try:
            md = storage.parquet_file(path).metadata
            names = md.schema.names
            mins: dict[str, Any] = {}
            maxs: dict[str, Any] = {}
            for col in primary_key:
                if col not in names:
                    continue
                ci = names.index(col)
                lo = hi = None
                for rg in range(md.num_row_groups):
                    st = md.row_group(rg).column(ci).statistics
                    if st is None or not st.has_min_max:
                        lo = hi = None
                        break
                    lo = st.min if lo is None or st.min < lo else lo
                    hi = st.max if hi is None or st.max > hi else hi
                if lo is not None and isinstance(lo, int | str):
                    mins[col], maxs[col] = lo, hi
            if mins:
                stats.update({"minValues": mins, "maxValues": maxs, "nullCount": dict.fromkeys(mins, 0)})
        except (OSError, ValueError) as exc:  # stats are an optimisation; never fail a commit on them
            log.debug("no stats for %s: %s", path, exc)
    return json.dumps(stats)


__all__ = ["add_actions", "relative_path", "remove_action", "stats_json"]
