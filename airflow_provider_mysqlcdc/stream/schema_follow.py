"""Following a source DDL in the stream: stop the batch that meets it, then follow it as the policy says.

Why two steps: the rows of a micro-batch after a DDL were decoded with the old schema (a new
column's values dropped), so none of the batch may be applied. The batch records the DDL in the
state store and fails (:func:`stop_before_unfollowed_ddl`); the job then evolves the Delta tables
and the manifest (:func:`follow_schema_change`) and restarts the query from its checkpoint, which
runs the same batch again, decoded with the new schema (docs/architecture.md, "Schema changes").
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.canonical_json import to_json
from airflow_provider_mysqlcdc.core.ddl import CREATE, column_renames, is_table_swap, rename_pairs, shadow_of
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, Manifest
from airflow_provider_mysqlcdc.core.manifest_build import offset_table
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.row_metadata import lake_schema
from airflow_provider_mysqlcdc.core.schema_policy import (
    DEFAULT_SCHEMA_CHANGE_POLICY,
    FAIL,
    column_diff,
    decide_alter,
    decide_table_ddl,
)
from airflow_provider_mysqlcdc.core.stream_state import PendingDdl, SchemaChange
from airflow_provider_mysqlcdc.core.table import SourceSchemaError, TableId, TableSchema
from airflow_provider_mysqlcdc.mysql.column_defaults import added_column_values
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.splitter import load_collations
from airflow_provider_mysqlcdc.mysql.table_moves import name_now
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_fill import fill_columns
from airflow_provider_mysqlcdc.sinks.delta_schema import UnsupportedSchemaChange
from airflow_provider_mysqlcdc.state import SCHEMA_CHANGE, StateStore

SCHEMA_HISTORY = "stream/schema-history.json"  # what the stream did with each DDL it met (the last ones)
HISTORY_KEPT = 200

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


def follow_schema_change(
    store: StateStore, sink: DeltaSink, settings: ConnectionSettings, policy: str = DEFAULT_SCHEMA_CHANGE_POLICY
) -> list[str]:
    """Follow the DDL :func:`stop_before_unfollowed_ddl` recorded, as ``policy`` says
    (core/schema_policy.py): evolve the Delta tables, record the decisions in the manifest.

    An ALTER is judged by what it did to the columns: the table's definition is read from the
    server and compared with the manifest's (renames come from the statements). TRUNCATE, DROP,
    RENAME and CREATE OR REPLACE are recorded as offsets the applier empties the table at and/or
    capture ends at. Raises :class:`StreamSchemaError` where the policy says stop or nothing can
    follow; nothing at or after the DDL has been applied then, and the message names the fix.
    """
    rec = store.read_schema_change()
    if rec is None:
        return []
    manifest = store.read_manifest()
    assert manifest is not None, "a schema change was recorded by a stream that had a manifest"
    sink.routes = manifest.selection.routing
    by_table: dict[str, list[PendingDdl]] = defaultdict(list)
    for c in rec.changes:
        by_table[c.table].append(c)
    done: list[dict[str, Any]] = []
    # created tables first: a cut-over in the same batch continues from a shadow table created in it
    for t, changes in sorted(by_table.items(), key=lambda kv: not any(c.kind == CREATE for c in kv[1])):
        changes = sorted(changes, key=lambda c: c.offset)
        creates = [c for c in changes if c.kind == CREATE]
        if creates:  # captured from its CREATE; DDL after it in this batch is met again after the restart
            c = creates[-1]
            statement = f"CREATE of {t} at {c.offset} ({c.sql[:200]})"
            action = decide_table_ddl(t, CREATE, policy, statement)
            if action.stop:
                raise StreamSchemaError(action.stop)
            note = _capture_created(sink, settings, manifest, t, c.offset)
            done.append({"table": t, "ddl": statement, "policy": policy, "done": note})
            log.info("%s (policy %s): %s", statement, policy, note)
            continue
        entry = manifest.tables[t]
        ending = next((c for c in changes if c.kind != "alter" and c.kind != "truncate"), None)
        alters = [c for c in changes if c.kind == "alter" and (ending is None or c.offset < ending.offset)]
        if alters:
            done.append(_follow_alters(sink, settings, t, entry, alters, policy, ending is not None))
        for c in changes:
            if c.kind == "alter" or entry.ended_at is not None:
                continue
            statement = f"{c.kind.upper()} of {t} at {c.offset} ({c.sql[:200]})"
            cut = _cut_over(settings, manifest, t, c, policy) if c.kind == "rename" else None
            if cut is not None:  # an online schema change's cut-over: capture goes on
                done.append({"table": t, "ddl": statement, "policy": policy, "done": cut})
                log.info("%s (policy %s): %s", statement, policy, cut)
                continue
            swap = c.kind == "rename" and is_table_swap(c.sql, t.split(".", 1)[0], t)
            action = decide_table_ddl(t, c.kind, policy, statement, swap)
            if action.stop:
                raise StreamSchemaError(action.stop)
            if action.empty:
                entry.emptied_at = sorted(set(entry.emptied_at) | {c.offset})
            if action.end:
                entry.ended_at = c.offset
            done.append({"table": t, "ddl": statement, "policy": policy, "done": action.note})
            log.info("%s (policy %s): %s", statement, policy, action.note)
        entry.schema_position = max(c.offset for c in changes)
    store.write_manifest(manifest)
    history = store.read_json(SCHEMA_HISTORY, default=[]) or []
    store.write_json(SCHEMA_HISTORY, (history + [{**d, "at": time.time()} for d in done])[-HISTORY_KEPT:])
    store.delete(SCHEMA_CHANGE)
    return sorted(by_table)


def _cut_over(settings: ConnectionSettings, manifest: Manifest, t: str, c: PendingDdl, policy: str) -> str | None:
    """A RENAME that is an online schema change's cut-over the stream can follow, or None.

    ``t`` renamed away while its captured shadow table (gh-ost ``_t_gho``, pt-osc ``_t_new``,
    captured from its CREATE) is renamed in under its name: ``t`` continues from the shadow's rows
    at the cut-over (the applier copies them in that batch) with the shadow's definition. The
    shadow's own RENAME ends its capture. Not followed (None): no captured shadow (the stream
    started after the shadow's CREATE), a changed primary key, or policy ``fail``."""
    if policy == FAIL:
        return None
    entry = manifest.tables[t]
    pairs = rename_pairs(c.sql, t.split(".", 1)[0])
    if entry.shadow_of is not None and (t, entry.shadow_of) in pairs:
        entry.ended_at = c.offset
        return f"renamed in as {entry.shadow_of} (cut-over), which continues from its rows; no longer captured"
    incoming = [a for a, b in pairs if b == t]
    shadow = manifest.tables.get(incoming[0]) if incoming else None
    if shadow is None or shadow.shadow_of != t or (shadow.ended_at not in (None, c.offset)):
        return None
    with settings.connect() as conn:
        new = replace(_definition_now(conn, settings, t, c.offset), table=TableId.parse(t))
    if [k.lower() for k in new.primary_key] != [k.lower() for k in entry.schema.primary_key]:
        return None
    entry.schema = new
    entry.added_columns = [col.name for col in new.columns if col.name not in entry.merge_key]
    entry.retired_columns, entry.renamed_columns, entry.added_defaults = [], {}, {}
    entry.replaced_from = [*entry.replaced_from, (c.offset, incoming[0])]
    return f"continues from the rows of its shadow table {incoming[0]} (online schema change cut-over)"


def _capture_created(
    sink: DeltaSink, settings: ConnectionSettings, manifest: Manifest, t: str, at: BinlogOffset
) -> str:
    """Capture ``t``, created at ``at`` while the stream runs: every row it has is in the binlog from
    there, so it needs no snapshot — one unbounded chunk with HW ``at`` (docs/architecture.md,
    "Tables created while streaming"). A table the checks refuse (no key, a type the lake cannot
    hold) is recorded in ``manifest.refused`` and left out, as a plan leaves out a table only a
    pattern selected. Returns what was done."""
    sel = manifest.selection
    origin = shadow_of(t)
    shadow = origin in manifest.tables and not sel.selects(t)  # captured as an online schema change's copy
    try:
        with settings.connect() as conn:
            # a quick migration's shadow may be renamed in already: its definition is under the original name
            schema = replace(_definition_now(conn, settings, t, at), table=TableId.parse(t))
            key = schema.chunk_key(sel.chunk_key_columns.get(origin if shadow and origin else t))
            collations = load_collations(conn, key, {})
        arrow = cdc_types.arrow_schema(schema)
    except (SourceSchemaError, cdc_types.UnsupportedColumnType, ValueError) as exc:
        manifest.refused[t] = {"offset": at.to_dict(), "reason": str(exc)[:500]}
        log.warning("%s was created at %s but is not captured: %s", t, at, exc)
        return f"not captured: {exc}"
    entry = offset_table(schema, [k.to_dict() for k in key], at)
    entry.changelog, entry.metadata_columns = sel.has_changelog(t), sel.metadata_columns
    if shadow and origin:  # its rows become the original table's at the cut-over: the same lake shape
        entry.shadow_of, entry.changelog = origin, False
        entry.metadata_columns = manifest.tables[origin].metadata_columns
    # images carry column names: one written before a later ADD COLUMN lacks it, and reads NULL there
    entry.added_columns = [c.name for c in schema.columns if c.name not in entry.merge_key]
    entry.schema_position = at
    lake = lake_schema(arrow, entry.metadata_columns)
    route = sink.route_of(t)  # a new shard of a routed table joins its shared Delta table
    entry.routed_to = route.target if route else None
    again = t in manifest.tables if route else sink.exists(t)
    try:
        if again:  # created again under a name captured before: the lake table starts over, empty
            sink.recreate_table(t, lake, entry.merge_key)
        else:
            sink.prepare_table(t, lake, entry.merge_key)
    except UnsupportedSchemaChange as exc:  # a shard whose columns do not fit its route's table
        manifest.refused[t] = {"offset": at.to_dict(), "reason": str(exc)[:500]}
        log.warning("%s was created at %s but is not captured: %s", t, at, exc)
        return f"not captured: {exc}"
    manifest.tables[t] = entry
    manifest.collations.update(collations)
    manifest.refused.pop(t, None)
    what = f" as the shadow copy of {origin} (online schema change)" if entry.shadow_of else ""
    return f"captured from its CREATE{what}" + (" (created again: its Delta table starts over)" if again else "")


def _follow_alters(
    sink: DeltaSink,
    settings: ConnectionSettings,
    t: str,
    entry: CapturedTable,
    alters: list[PendingDdl],
    policy: str,
    ends: bool,
) -> dict[str, Any]:
    """Follow a table's ALTERs of one batch: one decision for their combined effect on its columns.

    An added column's rows that existed got its default on the source with no row event: the Delta
    table's rows get it too (one rewrite, sinks/delta_fill.py), and the manifest records it for the
    images logged before the ALTER (``added_defaults``). An expression default (CURRENT_TIMESTAMP)
    was evaluated when the ALTER ran and cannot be known: that is a warning naming the re-snapshot.
    """
    last = alters[-1].offset
    statement = f"ALTER of {t} at {last} ({alters[-1].sql[:200]})"
    fix = f"Re-snapshot {t}: trigger the DAG with resnapshot_tables=['{t}'] (the stream then resumes past this DDL)"
    renames: dict[str, str] = {}
    for c in alters:
        renames.update(column_renames(c.sql))
    source = entry.source_schema
    try:
        with settings.connect() as conn:
            now = _definition_now(conn, settings, t, last)
            diff = column_diff(source, now, renames)
            values, expressions = added_column_values(conn, now, diff.added)
        new = replace(now, table=TableId.parse(t))
    except SourceSchemaError as exc:
        if ends:  # dropped later in the same batch: nothing after the drop is captured anyway
            return {"table": t, "ddl": statement, "policy": policy, "done": "not followed: the table was dropped"}
        raise StreamSchemaError(f"{t} changed at {last} and cannot be read now ({exc}). {fix}") from None
    retired = {c.lower() for c in entry.retired_columns}
    action = decide_alter(t, diff, policy, statement)
    if action.stop:
        raise StreamSchemaError(action.stop)
    keep = [c for c in entry.schema.columns if c.name.lower() in retired or c.name in action.retire_columns]
    keep = [c for c in keep if c.name.lower() not in {n.name.lower() for n in new.columns}]  # added back: live again
    lake = replace(new, columns=new.columns + [replace(c, nullable=True) for c in keep])
    try:
        evo = sink.evolve_schema(t, cdc_types.arrow_schema(lake), lake.merge_key(entry.chunk_key_columns),
                                 drop_columns=action.drop_columns, rename_columns=action.rename_columns)  # fmt: skip
    except UnsupportedSchemaChange as exc:
        raise StreamSchemaError(f"{exc} (DDL at {last}); the stream stopped before it") from None
    filled = {c: v for c, v in values.items() if v is not None}
    if filled:  # before the manifest says the ALTER is followed: a crash here follows it again, alike
        fill_columns(sink, t, filled)
    old_names = {c.name.lower() for c in entry.schema.columns}
    added = [c.name for c in new.columns if c.name.lower() not in old_names]
    live = {c.name for c in new.columns}
    kept = {action.rename_columns.get(c, c): v for c, v in entry.added_defaults.items()}
    entry.added_defaults = {**{c: v for c, v in kept.items() if c in live and c not in values}, **filled}
    entry.follow_ddl(lake, added, last)
    entry.retired_columns = [c.name for c in keep]
    entry.renamed_columns = _composed(entry.renamed_columns, action.rename_columns)
    log.info("%s (policy %s): %s; Delta table: added %s, widened %s, dropped %s, renamed %s", statement, policy,
             action.note, list(evo.added), list(evo.widened), list(evo.dropped), list(evo.renamed))  # fmt: skip
    done = {"table": t, "ddl": statement, "policy": policy, "done": action.note}
    if filled:
        done["filled"] = {c: to_json(v) for c, v in filled.items()}
    if expressions:  # evaluated by the ALTER on the source: the lake cannot know the value
        warning = (f"the rows {t} had before this ALTER got {expressions} (evaluated when the ALTER ran) in the "
                   f"source, but read NULL there in the lake (and so do changes logged before it): {fix}")  # fmt: skip
        log.warning("%s: %s", statement, warning)
        done["warning"] = warning
    return done


def _definition_now(conn: Any, settings: ConnectionSettings, t: str, since: BinlogOffset) -> TableSchema:
    """``t``'s definition on the source now, under the name it has now: a stream that is behind can
    meet a DDL of a table renamed since (a gh-ost shadow altered, then renamed in as the original
    before the stream got there); the binlog after ``since`` says where it went (mysql/table_moves.py).
    :class:`SourceSchemaError` if it was dropped, or cannot be read under any name."""
    try:
        return read_table_schema(conn, TableId.parse(t))
    except SourceSchemaError:
        moved = name_now(settings, t, since)
        if moved is None or moved == t:
            raise
        log.info("%s was renamed to %s after its DDL at %s: its definition is read under that name", t, moved, since)
        return read_table_schema(conn, TableId.parse(moved))


def _composed(earlier: dict[str, str], now: Mapping[str, str]) -> dict[str, str]:
    """Old -> current names after ``now`` renamed some columns again (a -> b, then b -> c: a -> c)."""
    out = {a: now.get(b, b) for a, b in earlier.items()}
    out.update({a: b for a, b in now.items() if a not in out.values()})
    return {a: b for a, b in out.items() if a != b}


__all__ = ["SchemaChangeReached", "StreamSchemaError", "follow_schema_change", "stop_before_unfollowed_ddl"]
