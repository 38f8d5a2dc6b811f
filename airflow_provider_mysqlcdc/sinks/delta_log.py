"""Commit data-file changes to a Delta table by writing its next log entry directly.

Why: a micro-batch over hundreds of small tables rewrites each of them, and delta-rs' Python
transaction path (reload the log, check conflicts, commit, reload again) costs more per table than
the rewrite itself. A writer that already knows the table's version (the stream, which alone writes
its tables: :mod:`~airflow_provider_mysqlcdc.sinks.delta_table_state`) needs none of that. The Delta
protocol's rule for a commit is that log entry ``N+1`` is created once, atomically, and never
replaced; it is written here with put-if-absent (a hard link on a local disk, S3's
``If-None-Match: *``). If the entry already exists another writer committed first, and the caller
starts again from the table as it now is (:class:`LogConflict`): nothing is ever overwritten.

Only tables whose protocol asks nothing of a writer beyond the actions written here (adds, removes,
an application transaction) are committed this way (:func:`unsupported_reason`); the others, and
storage without put-if-absent here, keep delta-rs' own commit. docs/architecture.md, "Committing
small tables".
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deltalake import DeltaTable

from airflow_provider_mysqlcdc import storage as lake_storage

#: Writer features that ask nothing of a writer adding and removing whole files of the current
#: schema. Absent on purpose: deletionVectors (a remove must carry the file's vector),
#: changeDataFeed, checkConstraints, generatedColumns, columnMapping, identityColumns, rowTracking,
#: clustering, icebergCompat*, domainMetadata, v2Checkpoint: each asks more of a writer.
PLAIN_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz", "typeWidening", "variantType"})
#: Delta's default for ``delta.checkpointInterval``.
CHECKPOINT_INTERVAL = 100
CLIENT = "airflow-provider-mysqlcdc"


class LogConflict(RuntimeError):
    """The log entry to write exists: another writer committed that version first."""


def unsupported_reason(dt: DeltaTable, allowed: frozenset[str] = PLAIN_WRITER_FEATURES) -> str | None:
    """Why ``dt`` must be committed by delta-rs instead (None: its log may be written here);
    ``allowed``: the writer features the caller honours."""
    protocol = dt.protocol()
    invariants = any("delta.invariants" in (f.metadata or {}) for f in dt.schema().fields)
    return writer_blocker(protocol.min_writer_version, protocol.writer_features, dt.metadata().configuration,
                          invariants, allowed)  # fmt: skip


def writer_blocker(min_writer_version: int, writer_features: Iterable[str] | None,
                   configuration: Mapping[str, str] | None, invariants: bool,
                   allowed: frozenset[str] = PLAIN_WRITER_FEATURES) -> str | None:  # fmt: skip
    """Why a table of this protocol and these properties asks more of a writer than the actions
    written here (None: nothing); ``allowed``: the writer features the caller honours."""
    if min_writer_version == 7:
        extra = sorted(set(writer_features or ()) - allowed)
        if extra:
            return f"writer features {', '.join(extra)}"
    elif min_writer_version > 2:
        return f"writer version {min_writer_version}"
    conf = configuration or {}
    if conf.get("delta.appendOnly", "false").lower() == "true":
        return "delta.appendOnly"
    if conf.get("delta.enableChangeDataFeed", "false").lower() == "true":
        return "delta.enableChangeDataFeed"
    if invariants:
        return "column invariants"
    return None


def log_writable(storage: lake_storage.LakeStorage, table_uri: str) -> bool:
    """Whether put-if-absent is available here for ``table_uri``'s storage (local disk and S3)."""
    return lake_storage.is_local(table_uri) or lake_storage.protocol(table_uri) in ("s3", "s3a")


def add_entry(path: str, size: int, partition_values: Mapping[str, str | None], modification_time: int,
              stats: str | None) -> dict[str, Any]:  # fmt: skip
    """An ``add`` action for a data file (``path`` relative to the table, URL-encoded as in the log)."""
    add: dict[str, Any] = {"path": path, "partitionValues": dict(partition_values), "size": int(size),
                           "modificationTime": int(modification_time), "dataChange": True}  # fmt: skip
    if stats is not None:
        add["stats"] = stats
    return {"add": add}


def remove_entry(path: str, size: int | None, partition_values: Mapping[str, str | None] | None,
                 deletion_timestamp: int) -> dict[str, Any]:  # fmt: skip
    """A ``remove`` action for a data file of the table."""
    remove: dict[str, Any] = {"path": path, "deletionTimestamp": int(deletion_timestamp), "dataChange": True}
    if size is not None and partition_values is not None:
        remove.update(extendedFileMetadata=True, partitionValues=dict(partition_values), size=int(size))
    return {"remove": remove}


def commit_actions(
    storage: lake_storage.LakeStorage,
    table_uri: str,
    read_version: int,
    actions: Sequence[Mapping[str, Any]],
    *,
    app_transaction: tuple[str, int] | None = None,
    metadata: Mapping[str, Any] | None = None,
    operation: str = "WRITE",
) -> int:
    """Write ``actions`` as version ``read_version + 1`` of the table at ``table_uri``; the version.

    ``app_transaction``: the ``(app_id, version)`` the commit records (a replay is then recognised
    by ``DeltaTable.transaction_version``). ``metadata`` goes into the commit's ``commitInfo``.
    Raises :class:`LogConflict` when that version exists.
    """
    version = read_version + 1
    now = int(time.time() * 1000)
    info: dict[str, Any] = {"timestamp": now, "operation": operation, "operationParameters": {},
                            "readVersion": read_version, "isolationLevel": "Serializable", "isBlindAppend": False,
                            "clientVersion": CLIENT, **(metadata or {})}  # fmt: skip
    lines = [{"commitInfo": info}, *actions]
    if app_transaction is not None:
        lines.append({"txn": {"appId": app_transaction[0], "version": int(app_transaction[1]), "lastUpdated": now}})
    data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
    if not _put_if_absent(storage, f"{table_uri.rstrip('/')}/_delta_log/{version:020d}.json", data):
        raise LogConflict(f"version {version} of {table_uri} was committed by another writer")
    return version


def entries_after(storage: lake_storage.LakeStorage, table_uri: str, version: int,
                  until: int | None = None) -> list[tuple[int, list[dict[str, Any]]]]:  # fmt: skip
    """The log entries after ``version`` (up to ``until``, else every one there is), in order, each
    as its actions; they must follow each other without a gap (an entry missing in between raises
    FileNotFoundError: the caller reads the table anew)."""
    log_dir = f"{table_uri.rstrip('/')}/_delta_log"
    if until is None:
        names = storage.listdir(log_dir)
        newer = sorted(int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit() and int(n[:20]) > version)
        until = newer[-1] if newer else version
    out = []
    for v in range(version + 1, until + 1):
        with storage.open(f"{log_dir}/{v:020d}.json", "rb") as f:
            out.append((v, [json.loads(line) for line in f.read().splitlines() if line.strip()]))
    return out


def checkpoint_due(version: int, configuration: Mapping[str, str] | None) -> bool:
    """Whether a checkpoint belongs at ``version`` (delta-rs' own commits make one every
    ``delta.checkpointInterval`` versions; so must a writer that bypasses them)."""
    try:
        interval = int((configuration or {}).get("delta.checkpointInterval", CHECKPOINT_INTERVAL))
    except ValueError:
        interval = CHECKPOINT_INTERVAL
    return interval > 0 and version > 0 and version % interval == 0


def _put_if_absent(storage: lake_storage.LakeStorage, url: str, data: bytes) -> bool:
    if lake_storage.is_local(url):
        path = lake_storage.local_path(url)
        tmp = f"{os.path.dirname(path)}/_commit_{uuid.uuid4()}.json.tmp"  # delta-rs' own temporary name
        # written whole before it is linked in, not fsynced: as delta-rs' own local commits (a staged
        # file hard-linked into place), and the data files it names are not fsynced either
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, path)  # atomic, and fails if the entry exists
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    fs, path = storage.filesystem(url)
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    return True


__all__ = [
    "PLAIN_WRITER_FEATURES",
    "LogConflict",
    "add_entry",
    "checkpoint_due",
    "commit_actions",
    "entries_after",
    "log_writable",
    "remove_entry",
    "unsupported_reason",
    "writer_blocker",
]
