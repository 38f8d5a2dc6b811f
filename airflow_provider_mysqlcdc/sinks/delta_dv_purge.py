"""Deletion vectors meet the paths that do not know them: purge first, and vacuum their files.

Why: the snapshot's group commits, a re-snapshot's swap, a repair and the bounded rewrite of a
huge batch remove data files by path and read them as Parquet — right only for files without a
deletion vector. Before such a commit on a table that has vectors, :func:`purge_deletion_vectors`
rewrites every file carrying one without its deleted rows (one commit without data change), so
what those paths read is the table. delta-rs' own MERGE, DELETE and OPTIMIZE honour the vectors
and need no purge.

delta-rs' VACUUM deletes only data files that removes name: vector files superseded by a newer
vector stay, and its full mode (orphans) would delete live ones. :func:`vacuum_vector_files` deletes
the vector files no version within the retention refers to; :func:`protected_vector_files` keeps
the live ones out of a full vacuum. docs/architecture.md, "Big tables: deletion vectors".
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable
from pyroaring import BitMap

from airflow_provider_mysqlcdc import storage as lake_storage
from airflow_provider_mysqlcdc.sinks.deletion_vector import keep_mask, read_vector, vector_location
from airflow_provider_mysqlcdc.sinks.delta_log import LogConflict, commit_actions
from airflow_provider_mysqlcdc.sinks.delta_log_replay import replay
from airflow_provider_mysqlcdc.sinks.delta_merge import COMMIT_ATTEMPTS, delta_arrow_schema
from airflow_provider_mysqlcdc.sinks.delta_rewrite import _conform, _FileWriter, _TableFiles
from airflow_provider_mysqlcdc.sinks.delta_stats import declared_stats_columns, file_stats

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink

log = logging.getLogger(__name__)

FEATURE = "deletionVectors"
VECTOR_FILE_PREFIX = "deletion_vector_"


def has_vectors_feature(dt: DeltaTable) -> bool:
    return FEATURE in (dt.protocol().reader_features or [])


def purge_deletion_vectors(sink: DeltaSink, table: str, dt: DeltaTable | None = None) -> int:
    """Rewrite every file of ``table`` that has a deletion vector without its deleted rows, in one
    commit without data change; the number of files rewritten (0: none had one)."""
    if not has_vectors_feature(dt if dt is not None else sink.open(table)):
        return 0
    uri = sink.table_uri(table)
    for attempt in range(COMMIT_ATTEMPTS):
        snapshot = replay(sink.storage, uri)
        marked = {rel: add for rel, add in snapshot.adds.items() if add.get("deletionVector")}
        if not marked:
            return 0
        t0 = time.monotonic()
        schema = delta_arrow_schema(sink.open(table))
        files = _TableFiles.of(sink, table, None)
        out = _FileWriter(files, files.stream_dir, f"purge-{int(t0 * 1000)}", schema, snapshot.configuration)
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = []
        cache: dict[str, bytes] = {}
        for rel, add in sorted(marked.items()):
            data = _conform(files.reader(rel).read(), schema)
            vector = read_file_vector(sink, uri, add["deletionVector"], cache)
            out.write(data.filter(pa.array(keep_mask(data.num_rows, vector))))
            remove = {"path": rel, "deletionTimestamp": now, "dataChange": False, "extendedFileMetadata": True,
                      "partitionValues": add.get("partitionValues") or {}, "size": add["size"],
                      "deletionVector": add["deletionVector"]}  # fmt: skip
            actions.append({"remove": remove})
        out.close()
        columns = declared_stats_columns(snapshot.configuration)
        actions += [{"add": {"path": f.rel, "partitionValues": {}, "size": f.size, "modificationTime": now,
                             "dataChange": False, "stats": file_stats(f.rows, f.ranges, columns)}}
                    for f in out.written]  # fmt: skip
        try:
            version = commit_actions(sink.storage, uri, snapshot.version, actions, operation="REORG",
                                     metadata={"mysqlcdc": json.dumps({"purged_deletion_vectors": len(marked)})})
        except LogConflict:
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        sink.table_states.forget(uri)
        log.info("%s: purged the deletion vectors of %d files (rewritten as %d, %d rows) as version %s in %.2fs",
                 table, len(marked), len(out.written), sum(f.rows for f in out.written), version,
                 time.monotonic() - t0)  # fmt: skip
        return len(marked)
    raise RuntimeError(f"could not purge the deletion vectors of {table}: {COMMIT_ATTEMPTS} concurrent commits")


def read_file_vector(sink: DeltaSink, uri: str, dv: dict[str, Any], cache: dict[str, bytes]) -> BitMap:
    """The deleted rows ``dv`` names, its vector file read once per ``cache``."""
    where = vector_location(dv)
    data = None
    if where is not None:
        url = where if dv["storageType"] == "p" else f"{uri.rstrip('/')}/{where}"
        if url not in cache:
            cache[url] = sink.storage.read_bytes(url)
        data = cache[url]
    return read_vector(dv, data)


def protected_vector_files(sink: DeltaSink, table: str) -> set[str]:
    """The vector files (relative to the table) the current version refers to."""
    snapshot = replay(sink.storage, sink.table_uri(table))
    return {where for a in snapshot.adds.values() if a.get("deletionVector")
            for where in [vector_location(a["deletionVector"])] if where is not None}  # fmt: skip


def vacuum_table_with_vectors(sink: DeltaSink, table: str, dt: DeltaTable, retention_seconds: float,
                              orphans: bool) -> list[str]:  # fmt: skip
    """Maintenance's vacuum of a table with deletion vectors; the files deleted.

    Data files: delta-rs' vacuum of expired removes, its retention in whole hours rounded up (its
    ``keep_versions``, which the plain tables' vacuum uses for an exact retention, replays every
    kept version: quadratic on a table the stream commits to every second). With ``orphans``, its
    full listing (which spares files removed within the retention) less the vector files. Vector
    files: those no version within the retention refers to (:func:`vacuum_vector_files`).
    """
    hours = math.ceil(retention_seconds / 3600)
    deleted = list(dt.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=False))
    if orphans:
        listed = dt.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=True, full=True)
        for rel in listed:
            if not rel.rsplit("/", 1)[-1].startswith(VECTOR_FILE_PREFIX):
                sink.storage.remove(f"{sink.table_uri(table)}/{rel}")
                deleted.append(rel)
    return deleted + vacuum_vector_files(sink, table, retention_seconds)


_TIMESTAMP = re.compile(rb'"timestamp":(\d+)')
_VECTOR_REF = re.compile(rb'"pathOrInlineDv":"([^"]+)"')


def _vectors_named_since(sink: DeltaSink, table: str, cutoff_ms: float) -> set[str]:
    """Vector files (relative) that the log entries committed since ``cutoff_ms``, and the entry
    current at the cutoff, name: what versions within the retention may read. Found by pattern,
    not by parsing the entries (a big table's entries name hundreds of vectors each); an inline
    vector's text taken for a name names no file, which is harmless here."""
    uri = sink.table_uri(table).rstrip("/")
    log_dir = f"{uri}/_delta_log"
    names: set[str] = set()
    entries = sorted((n for n in sink.storage.listdir(log_dir) if n.endswith(".json") and n[:20].isdigit()),
                     reverse=True)  # fmt: skip
    for name in entries:
        with sink.storage.open(f"{log_dir}/{name}", "rb") as f:
            data = f.read()
        for ref in set(_VECTOR_REF.findall(data)):
            text = ref.decode("ascii", "replace")
            if len(text) >= 20:
                try:
                    names.add(str(vector_location({"storageType": "u", "pathOrInlineDv": text})))
                except (ValueError, UnicodeError):
                    continue
        stamp = _TIMESTAMP.search(data)
        if stamp is None or int(stamp.group(1)) < cutoff_ms:
            break
    return names


def vacuum_vector_files(sink: DeltaSink, table: str, retention_seconds: float) -> list[str]:
    """Delete vector files in the table's directory that no version committed within
    ``retention_seconds`` refers to, and older than that; the files deleted.

    A vector file still needed by a version inside the retention is either live now or named by a
    remove committed since the cutoff (a file stops being live only by such a remove).
    """
    uri = sink.table_uri(table).rstrip("/")
    cutoff_ms = (time.time() - retention_seconds) * 1000
    keep = protected_vector_files(sink, table) | _vectors_named_since(sink, table, cutoff_ms)
    deleted = []
    for name, mtime_ms in _vector_files(sink, uri):
        if name not in keep and mtime_ms < cutoff_ms:
            sink.storage.remove(f"{uri}/{name}")
            deleted.append(name)
    if deleted:
        log.info("%s: vacuumed %d superseded deletion vector files", table, len(deleted))
    return deleted


def _vector_files(sink: DeltaSink, uri: str) -> list[tuple[str, float]]:
    """Vector files in the table's root directory, with their modification times (ms)."""
    if lake_storage.is_local(uri):
        root = lake_storage.local_path(uri)
        return [(n, os.path.getmtime(os.path.join(root, n)) * 1000) for n in os.listdir(root)
                if n.startswith(VECTOR_FILE_PREFIX) and n.endswith(".bin")]  # fmt: skip
    fs, path = sink.storage.filesystem(uri)
    out = []
    for info in fs.ls(path, detail=True):
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(VECTOR_FILE_PREFIX) and name.endswith(".bin"):
            stamp = info.get("LastModified") or info.get("mtime")
            out.append((name, stamp.timestamp() * 1000 if hasattr(stamp, "timestamp") else float(stamp or 0) * 1000))
    return out


__all__ = [
    "FEATURE",
    "has_vectors_feature",
    "protected_vector_files",
    "purge_deletion_vectors",
    "read_file_vector",
    "vacuum_table_with_vectors",
    "vacuum_vector_files",
]
