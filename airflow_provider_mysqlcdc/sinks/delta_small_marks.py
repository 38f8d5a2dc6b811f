"""What one batch commits to a small table: the table rewritten whole, or its changed rows marked.

Why two ways: rewriting a small table as one file per batch is the fastest apply and leaves the
table one file, but every batch supersedes the whole table, and the superseded copies stay on disk
for the readers of older versions (``sinks/delta_superseded.py``). A table changed in every batch
would keep one copy per batch of that grace. So a small table is rewritten whole only while no copy
an earlier rewrite superseded is still within its grace — at most once per grace; the batches in
between **mark** their changed rows deleted with deletion vectors and add one file of the batch's
rows, as the big tables do (``sinks/delta_dv_table.py``): bytes written = the rows changed. The
next whole rewrite folds those files and vectors back into one file. docs/architecture.md,
"Committing small tables": *Disk*.

Both plans are built from the rows the stream carries (``TableState.rows`` and where each lies,
``TableState.located``), so neither reads a file; the caller commits the plan's actions as one log
entry with the batch id and then takes the plan's state.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from airflow_provider_mysqlcdc.sinks.deletion_vector import VectorFileBuilder, vector_location
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_dv_purge import read_file_vector
from airflow_provider_mysqlcdc.sinks.delta_dv_table import _feature_actions, _remove_of, _stats_with_vector
from airflow_provider_mysqlcdc.sinks.delta_log import add_entry, entries_after, remove_entry
from airflow_provider_mysqlcdc.sinks.delta_log_replay import LogSnapshot, replay
from airflow_provider_mysqlcdc.sinks.delta_merge import conform_upserts
from airflow_provider_mysqlcdc.sinks.delta_rewrite import _TableFiles, write_sorted_rows
from airflow_provider_mysqlcdc.sinks.delta_stats import declared_stats_columns, file_stats
from airflow_provider_mysqlcdc.sinks.delta_table_state import Located, TableState
from airflow_provider_mysqlcdc.spill.changed_keys import member_mask


@dataclass
class BatchPlan:
    """A batch's log actions and the table's state once they are committed."""

    actions: list[dict[str, Any]]
    rows: pa.Table
    located: Located
    files: dict[str, int]
    adds: dict[str, dict[str, Any]]
    vectors: dict[str, BitMap]
    physical: dict[str, int]
    superseded: dict[str, int] = field(default_factory=dict)  # data files the commit removes
    whole: bool = True
    details: dict[str, Any] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)  # files the plan wrote (deleted if it never commits)

    @property
    def changes_metadata(self) -> bool:
        return any("metaData" in a or "protocol" in a for a in self.actions)


def may_mark(sink: DeltaSink, state: TableState) -> bool:
    """Whether this batch marks rows instead of rewriting ``state``'s table whole: deletion vectors
    are on and the copy its last whole rewrite superseded is still within its grace. (Not "any
    superseded file": a marking batch supersedes the small files whose every row it deleted, and a
    table changed in every batch would never be rewritten whole again.)"""
    superseded = sink.superseded
    return bool(sink.deletion_vectors and superseded is not None and superseded.rewrite_held(state.key))


def whole_plan(files: _TableFiles, state: TableState, table: str, upserts: pa.Table, deletes: pa.Table,
               key: list[str], version: int, fill_absent: bool, now: int) -> BatchPlan:  # fmt: skip
    """The table rewritten as ONE sorted file: its rows less the batch's changed keys, plus its upserts."""
    assert state.rows is not None
    changed = member_mask(state.rows.select(key), changed_keys(state.schema, upserts, deletes, key), key)
    rows = pa.concat_tables([state.rows.filter(pa.array(~changed)),
                             conform_upserts(table, state.schema, upserts, fill_absent)])  # fmt: skip
    rows = rows.sort_by([(c, "ascending") for c in key])
    actions = [_remove(state, rel, now) for rel in state.files]
    adds: dict[str, dict[str, Any]] = {}
    if rows.num_rows:
        columns = declared_stats_columns(state.configuration)
        f = write_sorted_rows(files, f"{files.stream_dir}/b{version:010d}-{uuid.uuid4().hex[:12]}-table.parquet",
                              rows, key, columns)  # fmt: skip
        add = add_entry(f.rel, f.size, state.partition, now, file_stats(f.rows, f.ranges, columns))
        actions.append(add)
        adds[f.rel] = add["add"]
    rel = next(iter(adds), "")
    return BatchPlan(actions, rows, Located.one_file(rel, rows.num_rows), {r: a["size"] for r, a in adds.items()},
                     adds, {}, {r: rows.num_rows for r in adds}, dict(state.files), whole=True,
                     written=list(adds))  # fmt: skip


def mark_plan(files: _TableFiles, state: TableState, table: str, upserts: pa.Table, deletes: pa.Table,
              key: list[str], version: int, fill_absent: bool, now: int) -> BatchPlan:  # fmt: skip
    """The batch's changed rows marked deleted in the files holding them (one vector file for the
    batch), its upserts added as ONE sorted file; a file whose every row is then deleted is removed."""
    assert state.rows is not None and state.located is not None and state.adds is not None
    assert state.protocol is not None and state.metadata is not None
    hit = np.flatnonzero(member_mask(state.rows.select(key), changed_keys(state.schema, upserts, deletes, key), key))
    where = state.located
    actions = _feature_actions(LogSnapshot(state.version, protocol=state.protocol, metadata=state.metadata))
    adds, vectors, physical = dict(state.adds), dict(state.vectors), dict(state.physical)
    superseded: dict[str, int] = {}
    written: list[str] = []
    builder = VectorFileBuilder()
    marked = 0
    for n in np.unique(where.file_no[hit]).tolist():
        rel = where.files[n]
        vector = BitMap(vectors.get(rel, BitMap()))
        vector.update(where.position[hit][where.file_no[hit] == n].astype(np.uint32))
        old = adds[rel]
        actions.append(_remove_of(old, now))
        if len(vector) >= physical[rel]:  # nothing of it is left: the file goes
            superseded[rel] = int(old["size"])
            del adds[rel]
            vectors.pop(rel, None)
            physical.pop(rel, None)
            continue
        add = {k: v for k, v in old.items() if k != "deletionVector"}
        add.update(dataChange=True, modificationTime=now, stats=_stats_with_vector(old, physical[rel]),
                   deletionVector=builder.descriptor(builder.append(vector), len(vector)))  # fmt: skip
        actions.append({"add": add})
        adds[rel], vectors[rel] = add, vector
        marked += 1
    if marked:
        files.write_bytes(builder.name, builder.getvalue())
        written.append(builder.name)
    keep = np.ones(state.rows.num_rows, dtype=bool)
    keep[hit] = False
    rows, located = state.rows.filter(pa.array(keep)), where.kept(keep)
    batch = conform_upserts(table, state.schema, upserts, fill_absent).sort_by([(c, "ascending") for c in key])
    if batch.num_rows:
        columns = declared_stats_columns(state.configuration)
        f = write_sorted_rows(files, f"{files.stream_dir}/b{version:010d}-{uuid.uuid4().hex[:12]}-rows.parquet",
                              batch, key, columns)  # fmt: skip
        add = add_entry(f.rel, f.size, state.partition, now, file_stats(f.rows, f.ranges, columns))
        actions.append(add)
        adds[f.rel], physical[f.rel] = add["add"], batch.num_rows
        written.append(f.rel)
        rows, located = pa.concat_tables([rows, batch]), located.plus_file(f.rel, batch.num_rows)
    return BatchPlan(actions, rows, located, {r: int(a["size"]) for r, a in adds.items()}, adds, vectors, physical,
                     superseded, whole=False, details={"marked_rows": len(hit), "marked_files": marked},
                     written=written)  # fmt: skip


def changed_keys(schema: pa.Schema, upserts: pa.Table, deletes: pa.Table, key: list[str]) -> pa.Table:
    """The keys a folded batch changes (its upserts' and its deletes'), typed as the table's."""
    key_schema = pa.schema([schema.field(c) for c in key])
    return pa.concat_tables([upserts.select(key).cast(key_schema), deletes.select(key).cast(key_schema)])


def _remove(state: TableState, rel: str, now: int) -> dict[str, Any]:
    """The remove of a live file as the log holds it (its deletion vector, if any, included)."""
    add = (state.adds or {}).get(rel)
    if add is not None:
        return _remove_of(add, now)
    return remove_entry(rel, state.files[rel], state.partition, now)


def read_log_view(sink: DeltaSink, state: TableState) -> bool:
    """Give ``state`` the live files' add actions, their deletion vectors, the protocol and the
    metadata, read from the log; False when the log is not at ``state``'s version or holds other
    files for it (the state is stale: read the table anew)."""
    snapshot = replay(sink.storage, state.uri)
    mine = {rel: add for rel, add in snapshot.adds.items() if (add.get("partitionValues") or {}) == state.partition}
    if snapshot.version != state.version or set(mine) != set(state.files):
        return False
    cache: dict[str, bytes] = {}
    vectors = {rel: read_file_vector(sink, state.uri, add["deletionVector"], cache)
               for rel, add in mine.items() if add.get("deletionVector")}  # fmt: skip
    if vectors and state.adds is None:  # rows were read without knowing of vectors
        return False
    state.adds, state.vectors = mine, vectors
    state.protocol, state.metadata = snapshot.protocol, snapshot.metadata
    return True


def catch_up(sink: DeltaSink, state: TableState, app_id: str, until: int | None = None) -> bool:
    """Bring ``state`` to the table's version ``until`` (default: the latest) when the commits since
    did not touch its files — another routed shard's batch (its own partition), a property set —
    True; False when they did (or changed the schema, or recorded this state's batches): read the
    table anew. The rule of Delta's own conflict check for writers of disjoint partitions."""
    try:
        entries = entries_after(sink.storage, state.uri, state.version, until)
    except FileNotFoundError:
        return False
    if not entries:
        return False
    metadata, protocol = state.metadata, state.protocol
    for _, actions in entries:
        for action in actions:
            if "add" in action and (action["add"].get("partitionValues") or {}) == (state.partition or {}):
                return False
            if "remove" in action and action["remove"]["path"] in state.files:
                return False
            if "txn" in action and action["txn"]["appId"] == app_id:
                return False
            if "metaData" in action:
                new = action["metaData"]
                if metadata is None or new.get("schemaString") != metadata.get("schemaString"):
                    return False
                metadata = new
            if "protocol" in action:
                protocol = action["protocol"]
    state.version = entries[-1][0]
    state.metadata, state.protocol = metadata, protocol
    if metadata is not None:
        state.configuration = dict(metadata.get("configuration") or {})
    return True


def vector_files_of(adds: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The deletion vector files ``adds`` refer to, with the bytes of their vectors."""
    out: dict[str, int] = {}
    for add in adds.values():
        dv = add.get("deletionVector")
        where = vector_location(dv) if dv else None
        if where is not None:
            out[where] = out.get(where, 0) + int(dv.get("sizeInBytes", 0))
    return out


def commit_details(plan: BatchPlan, app_id: str, version: int, upserts: int, deletes: int) -> dict[str, str]:
    """The commit's ``mysqlcdc`` metadata: what the batch was and which way it went."""
    details = {"app_id": app_id, "version": version, "upserts": upserts, "deletes": deletes,
               "small_table_rewrite": plan.whole, **plan.details}  # fmt: skip
    return {"mysqlcdc": json.dumps(details)}


__all__ = ["BatchPlan", "catch_up", "changed_keys", "commit_details", "mark_plan", "may_mark", "read_log_view",
           "vector_files_of", "whole_plan"]  # fmt: skip
