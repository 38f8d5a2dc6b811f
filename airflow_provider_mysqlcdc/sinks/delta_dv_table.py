"""Apply a stream batch to a BIG Delta table with deletion vectors: rows rewritten = rows changed.

Why: a MERGE rewrites every data file holding a changed key (copy-on-write). Updates spread over a
big table touch every file, so each batch rewrote the whole table. Here a batch

1. finds each changed key's file and row position in the index the stream keeps
   (:mod:`~airflow_provider_mysqlcdc.sinks.delta_key_index`);
2. marks those rows deleted: each touched file's deletion vector becomes its old one plus the new
   positions, all vectors of the batch in ONE vector file
   (:mod:`~airflow_provider_mysqlcdc.sinks.deletion_vector`);
3. writes the batch's upserts as ONE new data file;
4. commits it all as ONE log entry with the batch id (:mod:`~airflow_provider_mysqlcdc.sinks.delta_log`:
   put-if-absent) — readers see the batch whole or not at all; a replay is skipped.

The table's protocol gains the ``deletionVectors`` feature at its first such commit. Small files
the batches leave, and files more than half deleted, are compacted by the stream itself after a
batch (a commit without data change). Tables this layout does not serve keep the MERGE
(:func:`deletion_vector_blocker`). docs/architecture.md, "Big tables: deletion vectors".
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from airflow_provider_mysqlcdc.sinks.deletion_vector import VectorFileBuilder, keep_mask
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_dv_purge import FEATURE, read_file_vector
from airflow_provider_mysqlcdc.sinks.delta_key_index import KeyIndex
from airflow_provider_mysqlcdc.sinks.delta_log import (
    PLAIN_WRITER_FEATURES,
    LogConflict,
    checkpoint_due,
    commit_actions,
    log_writable,
    writer_blocker,
)
from airflow_provider_mysqlcdc.sinks.delta_log_replay import LogSnapshot, replay
from airflow_provider_mysqlcdc.sinks.delta_merge import COMMIT_ATTEMPTS, conform_upserts, delta_arrow_schema
from airflow_provider_mysqlcdc.sinks.delta_rewrite import (
    STREAM_DIR,
    _conform,
    _TableFiles,
    checkpoint_table,
    write_sorted_rows,
)
from airflow_provider_mysqlcdc.sinks.delta_stats import declared_stats_columns, file_stats

log = logging.getLogger(__name__)

#: Data files below this many rows are "small": the stream compacts them once there are
#: :data:`COMPACT_SMALL_FILES` of them.
SMALL_FILE_ROWS = 65_536
COMPACT_SMALL_FILES = 16
#: A file with more than this share of its rows deleted is rewritten without them.
PURGE_DELETED_SHARE = 0.5
#: Legacy writer versions' implied features (a table upgraded to writer version 7 must list them).
_LEGACY_WRITER_FEATURES = {1: (), 2: ("appendOnly", "invariants")}


@dataclass
class BigTableState:
    """What the stream knows of a big table it writes with deletion vectors (see module doc)."""

    uri: str
    key: str
    schema: pa.Schema
    snapshot: LogSnapshot
    index: KeyIndex
    vectors: dict[str, BitMap] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)  # physical rows of each live file

    @property
    def version(self) -> int:
        return self.snapshot.version


def deletion_vector_blocker(sink: DeltaSink, table: str, schema: pa.Schema, primary_key: list[str],
                            snapshot: LogSnapshot) -> str | None:  # fmt: skip
    """Why ``table`` keeps the MERGE rather than deletion vectors (None: it takes them)."""
    if sink.route_of(table) is not None:
        return "it is a routed table (its shards share its files)"
    if not log_writable(sink.storage, sink.table_uri(table)):
        return "its storage has no put-if-absent here"
    if len(primary_key) != 1:
        return "its primary key has several columns"
    key_type = schema.field(primary_key[0]).type if primary_key[0] in schema.names else None
    if key_type is None or not pa.types.is_integer(key_type):
        return "its primary key is not an integer column"
    if snapshot.metadata.get("partitionColumns"):
        return "it is partitioned"
    if int(snapshot.protocol.get("minReaderVersion", 1)) == 2:
        return "it uses column mapping"
    invariants = "delta.invariants" in (snapshot.metadata.get("schemaString") or "")
    reason = writer_blocker(int(snapshot.protocol.get("minWriterVersion", 2)), snapshot.protocol.get("writerFeatures"),
                            snapshot.configuration, invariants, PLAIN_WRITER_FEATURES | {FEATURE})  # fmt: skip
    return None if reason is None else f"its {reason} ask more of a writer"


def load_state(sink: DeltaSink, table: str, key: str, snapshot: LogSnapshot | None = None) -> BigTableState:
    """The table's state read from its log and files: every live row's key and position."""
    t0 = time.monotonic()
    uri = sink.table_uri(table)
    snapshot = snapshot or replay(sink.storage, uri)
    files = _TableFiles.of(sink, table, None)
    vector_files: dict[str, bytes] = {}
    vectors, rows, located = {}, {}, {}
    for rel, add in snapshot.adds.items():
        keys = files.reader(rel).read(columns=[key]).column(key).to_numpy(zero_copy_only=False).astype(np.int64)
        rows[rel] = len(keys)
        position = np.arange(len(keys), dtype=np.int64)
        dv = add.get("deletionVector")
        if dv:
            vectors[rel] = read_file_vector(sink, uri, dv, vector_files)
            keep = keep_mask(len(keys), vectors[rel])
            keys, position = keys[keep], position[keep]
        located[rel] = (keys, position)
    state = BigTableState(uri, key, delta_arrow_schema(sink.latest(table)), snapshot, KeyIndex.build(located),
                          vectors, rows)  # fmt: skip
    log.info("%s: indexed %d live rows of %d files (%d with deletion vectors) at version %s in %.2fs", table,
             len(state.index), len(rows), len(vectors), snapshot.version, time.monotonic() - t0)  # fmt: skip
    return state


def apply_big_table(sink: DeltaSink, table: str, upserts: pa.Table, deletes: pa.Table, primary_key: list[str],
                    app_id: str, version: int, state: BigTableState | None) -> bool | None:  # fmt: skip
    """:func:`apply_with_deletion_vectors` from the carried ``state``, or from the table read now;
    None when the table keeps the MERGE (the reason is logged once and kept in ``sink.dv_blocked``)."""
    if state is None:
        uri = sink.table_uri(table)
        dt = sink.latest(table)
        sink.check_owner(table, dt)
        snapshot = replay(sink.storage, uri)
        reason = deletion_vector_blocker(sink, table, delta_arrow_schema(dt), primary_key, snapshot)
        if reason is not None:
            sink.dv_blocked[uri] = reason
            log.info("%s: batches keep the MERGE, not deletion vectors: %s", table, reason)
            return None
        state = sink.table_states.put_big(load_state(sink, table, primary_key[0], snapshot))
    return apply_with_deletion_vectors(sink, table, upserts, deletes, state.key, app_id, version, state)


def apply_with_deletion_vectors(sink: DeltaSink, table: str, upserts: pa.Table, deletes: pa.Table, key: str,
                                app_id: str, version: int, state: BigTableState) -> bool:  # fmt: skip
    """Apply one folded batch to ``table`` (see module doc); False if the table records ``version``.

    ``state`` is the table as the stream last left it; if anything else committed since, the commit
    finds its version taken and the batch starts again from the table read anew.
    """
    for attempt in range(COMMIT_ATTEMPTS):
        done = state.snapshot.transactions.get(app_id)
        if done is not None and done >= version:
            log.info("%s: batch %s/%s already applied (table records %s); skipped", table, app_id, version, done)
            return False
        try:
            _commit_batch(sink, table, upserts, deletes, app_id, version, state)
        except LogConflict:
            if _catch_up(sink, table, state):
                continue
            log.info("%s: version %s was committed by another writer since this stream's last commit; reading the "
                     "table again for batch %s/%s", table, state.version + 1, app_id, version)  # fmt: skip
            time.sleep(min(0.01 * attempt, 1.0))
            state = sink.table_states.put_big(load_state(sink, table, key))
            continue
        if checkpoint_due(state.version, state.snapshot.configuration):
            checkpoint_table(sink, table)
        compact(sink, table, state)
        return True
    raise RuntimeError(
        f"could not apply batch {app_id}/{version} to {table}: {COMMIT_ATTEMPTS} attempts found a newer version "
        "committed by another writer; is another job writing this table?"
    )


def _catch_up(sink: DeltaSink, table: str, state: BigTableState) -> bool:
    """Bring ``state`` up to the table's latest version when the commits since changed no data file
    (maintenance setting a property, a batch id recorded elsewhere); False when they did, and the
    index must be read again."""
    log_dir = f"{state.uri.rstrip('/')}/_delta_log"
    newer = sorted(int(n[:20]) for n in sink.storage.listdir(log_dir)
                   if n.endswith(".json") and n[:20].isdigit() and int(n[:20]) > state.version)  # fmt: skip
    entries = []
    for v in newer:
        with sink.storage.open(f"{log_dir}/{v:020d}.json", "rb") as f:
            actions = [json.loads(line) for line in f.read().splitlines() if line.strip()]
        if any(a.get("add") or a.get("remove") for a in actions):
            return False
        entries.append(actions)
    if not newer or newer != list(range(state.version + 1, newer[-1] + 1)):
        return False
    for actions in entries:
        for action in actions:
            state.snapshot.apply(action)
    state.snapshot.version = newer[-1]
    if any(a.get("metaData") for actions in entries for a in actions):
        state.schema = delta_arrow_schema(sink.latest(table))
    log.info("%s: caught up with %d commit(s) of another writer that changed no data file (now version %s)",
             table, len(newer), state.version)  # fmt: skip
    return True


def _commit_batch(sink: DeltaSink, table: str, upserts: pa.Table, deletes: pa.Table, app_id: str, version: int,
                  state: BigTableState) -> None:  # fmt: skip
    """Steps 1-4 of the module doc; updates ``state`` after the commit (raises LogConflict)."""
    key = state.key
    rows = conform_upserts(table, state.schema, upserts).sort_by([(key, "ascending")])
    changed = np.concatenate([rows.column(key).to_numpy(zero_copy_only=False).astype(np.int64),
                              deletes.column(key).to_numpy(zero_copy_only=False).astype(np.int64)])  # fmt: skip
    where = state.index.locate(changed)
    hit_files, hit_positions = where.file_no[where.found], where.position[where.found]
    files = _TableFiles.of(sink, table, None)
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = _feature_actions(state.snapshot)
    new_vectors: dict[str, BitMap] = {}
    builder = VectorFileBuilder()
    for n in np.unique(hit_files).tolist():
        rel = state.index.files[n]
        vector = BitMap(state.vectors.get(rel, BitMap()))
        vector.update(hit_positions[hit_files == n].astype(np.uint32))
        new_vectors[rel] = vector
        old = state.snapshot.adds[rel]
        actions.append(_remove_of(old, now))
        actions.append({"add": {**_without_vector(old), "dataChange": True, "modificationTime": now,
                                "stats": _stats_with_vector(old, state.rows[rel]),
                                "deletionVector": builder.descriptor(builder.append(vector), len(vector))}})
    if new_vectors:
        files.write_bytes(builder.name, builder.getvalue())
    written = None
    if rows.num_rows:
        columns = declared_stats_columns(state.snapshot.configuration)
        written = write_sorted_rows(files, f"{files.stream_dir}/b{version:010d}-{uuid.uuid4().hex[:12]}-dv.parquet",
                              rows, [key], columns)  # fmt: skip
        actions.append({"add": {"path": written.rel, "partitionValues": {}, "size": written.size,
                                "modificationTime": now, "dataChange": True,
                                "stats": file_stats(written.rows, written.ranges, columns)}})  # fmt: skip
    details = {"app_id": app_id, "version": version, "upserts": upserts.num_rows, "deletes": deletes.num_rows,
               "deletion_vectors": len(new_vectors)}  # fmt: skip
    committed = commit_actions(sink.storage, state.uri, state.version, actions, app_transaction=(app_id, version),
                               metadata={"mysqlcdc": json.dumps(details)}, operation="MERGE")  # fmt: skip
    for action in actions:
        state.snapshot.apply(action)
    state.snapshot.version = committed
    state.snapshot.transactions[app_id] = version
    state.vectors.update(new_vectors)
    state.index.forget(changed[where.found])
    if written is not None:
        state.rows[written.rel] = written.rows
        state.index.add_file(written.rel, rows.column(key).to_numpy(zero_copy_only=False))
    log.debug("%s: batch %s/%s marked %d rows deleted in %d files and wrote %d rows as version %s", table, app_id,
              version, len(hit_files), len(new_vectors), rows.num_rows, committed)  # fmt: skip


def _feature_actions(snapshot: LogSnapshot) -> list[dict[str, Any]]:
    """The protocol (and property) upgrade a table needs before its first deletion vector."""
    if snapshot.has_feature(FEATURE):
        return []
    p = snapshot.protocol
    readers = set(p.get("readerFeatures") or ()) if int(p.get("minReaderVersion", 1)) == 3 else set()
    writer_version = int(p.get("minWriterVersion", 2))
    legacy = _LEGACY_WRITER_FEATURES[writer_version] if writer_version < 7 else ()
    writers = set(p.get("writerFeatures") or ()) if writer_version == 7 else set(legacy)
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": sorted(readers | {FEATURE}),
                "writerFeatures": sorted(writers | {FEATURE})}  # fmt: skip
    metadata = {**snapshot.metadata,
                "configuration": {**snapshot.configuration, "delta.enableDeletionVectors": "true"}}  # fmt: skip
    return [{"protocol": protocol}, {"metaData": metadata}]


def _without_vector(add: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in add.items() if k != "deletionVector"}


def _remove_of(add: dict[str, Any], now: int, data_change: bool = True) -> dict[str, Any]:
    """The remove of a live file exactly as it is now (its deletion vector included)."""
    remove = {"path": add["path"], "deletionTimestamp": now, "dataChange": data_change, "extendedFileMetadata": True,
              "partitionValues": add.get("partitionValues") or {}, "size": add["size"]}  # fmt: skip
    if add.get("deletionVector"):
        remove["deletionVector"] = add["deletionVector"]
    return {"remove": remove}


def _stats_with_vector(add: dict[str, Any], rows: int) -> str:
    """The file's statistics once rows of it are deleted: its physical row count (readers subtract
    the vector's cardinality) and bounds marked no longer tight."""
    try:
        stats = json.loads(add.get("stats") or "{}")
    except ValueError:
        stats = {}
    stats["numRecords"] = rows
    stats["tightBounds"] = False
    return json.dumps(stats)


def compact(sink: DeltaSink, table: str, state: BigTableState) -> int:
    """Rewrite, without their deleted rows, the small files the stream wrote once there are enough
    of them, and every file more than half deleted — one commit without data change. The files
    rewritten."""
    # the files batches and earlier compactions wrote (never the snapshot's: those are left as they are)
    small = [rel for rel, n in state.rows.items() if n < SMALL_FILE_ROWS and rel.startswith(f"{STREAM_DIR}/")]
    pick = set(small) if len(small) >= COMPACT_SMALL_FILES else set()
    pick |= {rel for rel, v in state.vectors.items() if len(v) > PURGE_DELETED_SHARE * state.rows.get(rel, 0)}
    pick &= set(state.snapshot.adds)
    if not pick:
        return 0
    t0 = time.monotonic()
    files = _TableFiles.of(sink, table, None)
    parts = []
    for rel in sorted(pick):
        data = _conform(files.reader(rel).read(), state.schema)
        if rel in state.vectors:
            data = data.filter(pa.array(keep_mask(data.num_rows, state.vectors[rel])))
        parts.append(data)
    rows = pa.concat_tables(parts).sort_by([(state.key, "ascending")])
    now = int(time.time() * 1000)
    actions = [_remove_of(state.snapshot.adds[rel], now, data_change=False) for rel in sorted(pick)]
    written = None
    if rows.num_rows:
        columns = declared_stats_columns(state.snapshot.configuration)
        written = write_sorted_rows(files, f"{files.stream_dir}/compact-{uuid.uuid4().hex[:12]}.parquet", rows,
                              [state.key], columns)  # fmt: skip
        actions.append({"add": {"path": written.rel, "partitionValues": {}, "size": written.size,
                                "modificationTime": now, "dataChange": False,
                                "stats": file_stats(written.rows, written.ranges, columns)}})  # fmt: skip
    try:
        committed = commit_actions(sink.storage, state.uri, state.version, actions, operation="OPTIMIZE",
                                   metadata={"mysqlcdc": json.dumps({"compacted_files": len(pick)})})  # fmt: skip
    except LogConflict:  # another writer: the next batch reads the table again
        sink.table_states.forget(state.uri)
        return 0
    for action in actions:
        state.snapshot.apply(action)
    state.snapshot.version = committed
    for rel in pick:
        state.rows.pop(rel, None)
        state.vectors.pop(rel, None)
    state.index.drop_files(pick)
    if written is not None:
        state.rows[written.rel] = written.rows
        state.index.add_file(written.rel, rows.column(state.key).to_numpy(zero_copy_only=False))
    log.info("%s: compacted %d files (%d live rows) into one as version %s in %.2fs", table, len(pick),
             rows.num_rows, committed, time.monotonic() - t0)  # fmt: skip
    if checkpoint_due(committed, state.snapshot.configuration):
        checkpoint_table(sink, table)
    return len(pick)


__all__ = [
    "COMPACT_SMALL_FILES",
    "PURGE_DELETED_SHARE",
    "SMALL_FILE_ROWS",
    "BigTableState",
    "apply_big_table",
    "apply_with_deletion_vectors",
    "compact",
    "deletion_vector_blocker",
    "load_state",
]
