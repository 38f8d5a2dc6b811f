"""Delta Lake sink (delta-rs via the ``deltalake`` package): one Delta table per source table.

Snapshot groups are committed by *adopting* the Parquet files Spark staged inside the table's
directory — no second pass over the data. Each commit is one Delta transaction that removes every
file an earlier attempt of the same group added and adds the new ones, so re-running a chunk or a
whole group is idempotent, and a crash before the commit leaves nothing visible (the orphaned
staged files are invisible to readers and removed by VACUUM). Concurrent groups commit
concurrently: they touch disjoint files, which delta-rs' conflict checker accepts.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from airflow_provider_mysqlcdc.sinks.base import StagedFile

log = logging.getLogger(__name__)

SNAPSHOT_DIR = "snapshot"


def _group_prefix(group_key: str) -> str:
    return f"{SNAPSHOT_DIR}/{group_key}/"


class DeltaSink:
    """``<root>/<db>/<table>`` Delta tables. ``root`` is a local path or a URL delta-rs understands."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        if not root:
            raise ValueError("sink_root is empty: give the directory or URL where Delta tables should go")
        self.root = str(root).rstrip("/")
        self.storage_options = storage_options or None

    def table_uri(self, table: str) -> str:
        db, _, name = table.partition(".")
        return f"{self.root}/{db}/{name}"

    def _is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    def open(self, table: str) -> DeltaTable:
        return DeltaTable(self.table_uri(table), storage_options=self.storage_options)

    def exists(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.table_uri(table), storage_options=self.storage_options)

    # ------------------------------------------------------------------ snapshot
    def prepare_table(self, table: str, schema: pa.Schema, primary_key: list[str]) -> None:
        if self.exists(table):
            return
        uri = self.table_uri(table)
        if self._is_local():
            os.makedirs(uri, exist_ok=True)
        try:
            DeltaTable.create(
                uri,
                schema,
                mode="ignore",  # another group may create it concurrently
                name=table,
                description=f"CDC copy of {table} (primary key: {', '.join(primary_key)})",
                configuration={"delta.appendOnly": "false"},
                storage_options=self.storage_options,
            )
        except Exception as exc:  # lost a creation race: fine if the table now exists
            if not self.exists(table):
                raise
            log.debug("table %s created concurrently (%s)", table, exc)

    def replace_table(self, table: str, schema: pa.Schema, primary_key: list[str]) -> None:
        """Empty ``table`` (one commit) so a re-snapshot starts clean; readers see old or new, never half."""
        if not self.exists(table):
            self.prepare_table(table, schema, primary_key)
            return
        dt = self.open(table)
        dt.delete()
        log.info("emptied Delta table %s for a re-snapshot (version %s)", table, dt.version())

    def staging_location(self, table: str, group_key: str, attempt: str) -> str:
        return f"{self.table_uri(table)}/{_group_prefix(group_key)}{attempt}"

    def commit_snapshot_group(
        self,
        table: str,
        group_key: str,
        files: list[StagedFile],
        schema: pa.Schema,
        metadata: dict[str, Any],
        primary_key: list[str] | None = None,
    ) -> int:
        """One Delta commit: remove this group's earlier files, add ``files``. Returns the new version."""
        uri = self.table_uri(table)
        prefix = _group_prefix(group_key)
        now = int(time.time() * 1000)
        for attempt in range(20):
            dt = self.open(table)
            old = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
            removes = [
                RemoveAction(path=p, data_change=True, deletion_timestamp=now, size=sz)
                for p, sz in zip(old.get("path", []), old.get("size_bytes", []), strict=False)
                if p.startswith(prefix)
            ]
            adds = []
            for f in files:
                rel = _relative(uri, f.path)
                if not rel.startswith(prefix):
                    raise ValueError(f"staged file {f.path} is not under {uri}/{prefix}")
                adds.append(
                    AddAction(
                        path=rel,
                        size=f.size,
                        partition_values={},
                        modification_time=now,
                        data_change=True,
                        stats=_stats_json(f.path, f.rows, primary_key or []),
                    )
                )
            try:
                dt.create_write_transaction(
                    [*removes, *adds],
                    mode="append",
                    schema=schema,
                    commit_properties=CommitProperties(custom_metadata={"mysqlcdc": json.dumps(metadata)}),
                )
                version = self.open(table).version()
                log.info(
                    "%s: committed group %s (%d files, %d rows; replaced %d earlier files) as version %s",
                    table, group_key, len(adds), sum(f.rows for f in files), len(removes), version,
                )
                return version
            except Exception as exc:  # concurrent commit of the same version: re-read and retry
                if "version" in str(exc).lower() and "exist" in str(exc).lower() and attempt < 19:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                raise
        raise RuntimeError(f"could not commit snapshot group {group_key} to {table}")


def _relative(table_uri: str, path: str) -> str:
    t = table_uri.rstrip("/") + "/"
    for cand in (path, path.replace("file://", "", 1), os.path.abspath(path) if "://" not in path else path):
        if cand.startswith(t):
            return cand[len(t):]
    t_abs = os.path.abspath(table_uri).rstrip("/") + "/"
    p_abs = os.path.abspath(path.replace("file:", "", 1).lstrip("/") if path.startswith("file:") else path)
    if p_abs.startswith(t_abs):
        return p_abs[len(t_abs):]
    raise ValueError(f"{path} is not inside table {table_uri}")


def _stats_json(path: str, rows: int, primary_key: list[str]) -> str:
    """Delta file statistics: row count, and min/max of the key columns for data skipping in MERGE."""
    stats: dict[str, Any] = {"numRecords": rows}
    if primary_key and rows:
        try:
            md = pq.ParquetFile(path).metadata
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


__all__ = ["DeltaSink", "StagedFile", "TableNotFoundError"]
