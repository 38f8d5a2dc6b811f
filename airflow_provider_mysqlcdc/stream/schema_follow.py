"""Following a source ``ALTER TABLE`` in the stream: stop the batch that meets it, then follow it.

Why two steps: the rows of a micro-batch after a DDL were decoded with the old schema (a new
column's values dropped), so none of the batch may be applied. The batch records the DDL in the
state store and fails (:func:`stop_before_unfollowed_ddl`); the job then evolves the Delta tables
and the manifest (:func:`follow_schema_change`) and restarts the query from its checkpoint, which
runs the same batch again, decoded with the new schema (docs/architecture.md, "The binlog event
state machine").
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.stream_state import PendingDdl, SchemaChange
from airflow_provider_mysqlcdc.core.table import SourceSchemaError, TableId
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_schema import UnsupportedSchemaChange
from airflow_provider_mysqlcdc.state import SCHEMA_CHANGE, StateStore

log = logging.getLogger(__name__)


class SchemaChangeReached(RuntimeError):
    """A micro-batch holds a DDL on a captured table that the stream has not followed yet."""


class StreamSchemaError(RuntimeError):
    """A DDL the Delta tables cannot follow; the message names the table and the fix."""


def stop_before_unfollowed_ddl(
    store: StateStore, data: pa.Table, batch_id: int, followed_at: Mapping[str, BinlogOffset]
) -> None:
    """Stop the batch before anything is applied if it holds a DDL the stream has not followed.

    Records the DDL for :func:`follow_schema_change` and raises :class:`SchemaChangeReached`.
    ``followed_at`` is, per table, the offset of the last DDL its manifest entry already follows
    (the replayed batch meets that DDL again and must go on).
    """
    ddl = data.filter(pc.equal(data.column("kind"), "ddl"))  # rare: most batches have none
    pending = []
    for row in ddl.select(["tbl", "info", "file", "pos"]).to_pylist():
        t = row["tbl"]
        at = BinlogOffset(row["file"], int(row["pos"]))
        done = followed_at.get(t)
        if done is not None and at <= done:
            continue
        info = json.loads(row["info"])
        pending.append(PendingDdl(t, info["kind"], info["sql"], at))
    if pending:
        store.write_schema_change(SchemaChange(batch_id, pending, time.time()))
        what = [f"{c.kind.upper()} of {c.table} at {c.offset}" for c in pending]
        raise SchemaChangeReached("; ".join(what))


def follow_schema_change(store: StateStore, sink: DeltaSink, settings: ConnectionSettings) -> list[str]:
    """Follow the DDL :func:`stop_before_unfollowed_ddl` recorded: evolve the Delta tables and the manifest.

    ``ALTER TABLE`` that adds columns or widens types is followed (the table's current definition is
    read from the server; older rows read NULL in added columns). Anything else — TRUNCATE, DROP,
    RENAME, CREATE OR REPLACE, a changed primary key, a dropped or narrowed column — raises
    :class:`StreamSchemaError`: nothing at or after the DDL has been applied, and re-snapshotting
    the table (backfill) moves its filters past the DDL.
    """
    rec = store.read_schema_change()
    if rec is None:
        return []
    manifest = store.read_manifest()
    assert manifest is not None, "a schema change was recorded by a stream that had a manifest"
    by_table: dict[str, list[PendingDdl]] = defaultdict(list)
    for c in rec.changes:
        by_table[c.table].append(c)
    fix = "Re-snapshot {t}: trigger the DAG with resnapshot_tables=['{t}'] (the stream then resumes past this DDL)"
    followed = []
    for t, changes in by_table.items():
        last = max(c.offset for c in changes)
        for c in changes:
            if c.kind != "alter":
                raise StreamSchemaError(
                    f"{c.kind.upper()} of {t} at {c.offset} ({c.sql[:200]}): the "
                    f"binlog has no row changes for it, so the Delta table cannot follow. {fix.format(t=t)}. "
                    "The stream stopped before it; nothing after it was applied"
                )
        entry = manifest.tables[t]
        old = entry.schema
        try:
            with settings.connect() as conn:
                new = read_table_schema(conn, TableId.parse(t))
        except SourceSchemaError as exc:
            msg = f"{t} changed at {last} and cannot be read now ({exc}). {fix.format(t=t)}"
            raise StreamSchemaError(msg) from None
        if [c.lower() for c in new.primary_key] != [c.lower() for c in old.primary_key]:
            raise StreamSchemaError(
                f"the primary key of {t} changed at {last} (from {old.primary_key} to {new.primary_key}): rows are "
                f"merged by that key. {fix.format(t=t)}"
            )
        try:
            evo = sink.evolve_schema(t, cdc_types.arrow_schema(new), new.merge_key(entry.chunk_key_columns))
        except UnsupportedSchemaChange as exc:
            raise StreamSchemaError(f"{exc} (DDL at {last}); the stream stopped before it") from None
        old_names = {c.name.lower() for c in old.columns}
        added = [c.name for c in new.columns if c.name.lower() not in old_names]
        entry.follow_ddl(new, added, last)
        followed.append(t)
        log.info("followed the DDL of %s at %s: added %s, widened %s", t, last, list(evo.added), list(evo.widened))
    store.write_manifest(manifest)
    store.delete(SCHEMA_CHANGE)
    return followed


__all__ = ["SchemaChangeReached", "StreamSchemaError", "follow_schema_change", "stop_before_unfollowed_ddl"]
