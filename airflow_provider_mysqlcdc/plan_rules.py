"""The plan step's rules: what a run may do with the pipeline's current state, and where new
tables start. Split from ``pipeline.py`` (the steps themselves); every refusal is a
:class:`PipelineStateError` whose message says why and what to do (docs/architecture.md,
"Purged binlog", "Repair", "Binlog offsets")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.config import MAX_CHUNKS_PER_TABLE, PipelineConfig
from airflow_provider_mysqlcdc.core.gtid import GtidSet, GtidSetError
from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS, incompatible_shards
from airflow_provider_mysqlcdc.core.row_metadata import METADATA_COLUMNS, reserved_columns
from airflow_provider_mysqlcdc.core.table import TableId, TableSchema
from airflow_provider_mysqlcdc.mysql import server as source_server
from airflow_provider_mysqlcdc.mysql.binlog_time import earliest_offset, offset_at_time
from airflow_provider_mysqlcdc.mysql.checks import row_filter_problem
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.gtid_positions import GtidPositionError, position_of
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError
from airflow_provider_mysqlcdc.sinks.delta_changelog import CHANGELOG_DIR
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import checkpoint_offset

log = logging.getLogger(__name__)

#: Airflow's default ``[core] max_map_length``: a plan with more groups could not be mapped.
MAX_MAPPED_GROUPS = 1024


class PipelineStateError(RuntimeError):
    """The pipeline's state does not allow this step; the message says why and what to do."""


def purged_restart(
    conn: Any, store: StateStore, manifest: Manifest | None, config: PipelineConfig, tables: list[str],
    lost: str | None = None,
) -> bool:
    """Whether this run recovers from a purged binlog: the stream's restart offset (its checkpoint,
    or the manifest's start) is gone from the source — or, ``lost``, cannot be placed on the server
    a failover led to. Without ``recover_purged`` that is an error naming it: nothing may silently
    skip the lost changes."""
    if manifest is None:
        return False
    restart = checkpoint_offset(store, manifest) or manifest.start_offset
    try:
        if lost is None:
            source_server.ensure_offset_available(conn, restart)
            return False
    except BinlogUnavailableError as exc:
        lost = str(exc).split(" has been purged", 1)[0]
        if not config.recover_purged:
            raise PipelineStateError(
                f"the stream cannot resume: {lost} has been purged from the source, so the changes after {restart} "
                "are lost to CDC. Trigger the DAG with recover_purged=true: the stream restarts from new snapshots of "
                "every captured table (read while the source is written, as any snapshot) and nothing is skipped "
                "silently. Then raise the binlog retention (binlog_expire_logs_seconds / expire_logs_days)"
            ) from None
    missing = sorted(set(manifest.tables) - set(tables))
    if missing:
        raise PipelineStateError(
            f"recover_purged re-snapshots every captured table, and {missing} are captured but not selected by "
            "tables (or fail its checks): add them to tables for this run"
        )
    log.warning("the stream's restart offset %s was purged: recovering by re-snapshotting %s", restart,
                sorted(manifest.tables))  # fmt: skip
    return True


def chosen_repairs(config: PipelineConfig, captured: Manifest | None, snapshot_tables: list[str], notes: list[str],
                   conn: Any = None) -> dict[str, list[int]]:  # fmt: skip
    """The chunks to read again: ``repair_chunks``, and every chunk of a table with a
    ``snapshot_filters`` condition (a partial backfill reads the rows it selects in every chunk) —
    of captured tables not snapshotted whole by this run anyway. A filter is parsed by the source
    first (``conn``), so a typo stops the plan, not a snapshot task."""
    asked = dict(config.repair_chunks)
    for t in config.snapshot_filters:
        if t not in asked and captured is not None and t in captured.tables:
            asked[t] = sorted(c.chunk.split_id for c in captured.tables[t].chunks)
    if not asked and not config.snapshot_filters:
        return {}
    have = set(captured.tables) if captured else set()
    for what, names in (("repair_chunks", config.repair_chunks), ("snapshot_filters", config.snapshot_filters)):
        missing = sorted(t for t in names if t not in have)
        if missing:
            raise PipelineStateError(
                f"{what} names {missing}, which this pipeline does not capture yet: only a captured table's "
                "rows can be read again (a new table is snapshotted whole; leave it out of " + what + " for its "
                "first run)"
            )
    for t, cond in config.snapshot_filters.items():
        why = row_filter_problem(conn, t, cond) if conn is not None else None
        if why:
            raise PipelineStateError(f"snapshot_filters[{t!r}] is not a condition the source accepts: {why}. Fix "
                                     "the condition (it is a WHERE clause on the table's columns)")  # fmt: skip
    whole = sorted(t for t in asked if t in snapshot_tables)
    if whole:
        notes.append(f"{whole} are snapshotted whole by this run: their repair_chunks / snapshot_filters are not "
                     "needed")  # fmt: skip
    return {t: ids for t, ids in asked.items() if t not in snapshot_tables}


def check_metadata_columns(config: PipelineConfig, captured: Manifest | None, tables: list[str]) -> None:
    """A Delta table keeps the columns it was created with: ``metadata_columns`` cannot change for
    a table already captured (docs/architecture.md, "Metadata columns")."""
    if captured is None:
        return
    other = sorted(t for t in tables if t in captured.tables
                   and captured.tables[t].metadata_columns != config.metadata_columns)  # fmt: skip
    if other:
        was = "without" if config.metadata_columns else "with"
        raise PipelineStateError(
            f"metadata_columns is {str(config.metadata_columns).lower()}, but {other} were captured {was} them, and "
            f"a Delta table keeps the columns it was created with. Set metadata_columns="
            f"{str(not config.metadata_columns).lower()} for this pipeline, or capture the tables with a new "
            "pipeline_id into a new sink_root"
        )


def check_changelog_location(config: PipelineConfig, tables: list[str]) -> None:
    """Changelog tables live under ``<sink_root>/_changelog/``, where a source database of that
    name would put its mirror tables too."""
    clash = [t for t in tables if t.split(".", 1)[0] == CHANGELOG_DIR]
    if config.changelog_tables and clash:
        raise PipelineStateError(
            f"{clash} are in a database named {CHANGELOG_DIR}, whose Delta tables would sit among the changelog "
            f"tables at <sink_root>/{CHANGELOG_DIR}/: capture that database with a pipeline of its own (another "
            "sink_root) without changelog_tables"
        )


def check_reserved_columns(config: PipelineConfig, schemas: dict[str, TableSchema]) -> None:
    """With ``metadata_columns`` on, no source column may have a metadata column's name."""
    if not config.metadata_columns:
        return
    clash = {t: found for t, s in schemas.items() if (found := reserved_columns(c.name for c in s.columns))}
    if clash:
        raise PipelineStateError(
            f"metadata_columns adds the columns {list(METADATA_COLUMNS)} to the Delta tables, but {clash} already "
            "have columns of those names: set metadata_columns=false, or leave those tables out of tables"
        )


def check_routes(conn: Any, config: PipelineConfig, captured: Manifest | None, tables: list[str]) -> list[str]:
    """The routes of sharded tables (docs/architecture.md, "Routing sharded tables"): a target is no
    captured table of its own, a captured table keeps the Delta table it was captured into, and the
    shards of one target type the columns they share alike and have the same key (read from the
    source, named per column when they differ; a column only some shards have is NULL in the others).
    Returns the plan's notes on what each route collected."""
    routes = config.routing
    if not routes.rules:
        return []
    by_target: dict[str, list[str]] = {}
    for t in tables:
        r = routes.route_of(t)
        if r is not None:
            by_target.setdefault(r.target, []).append(t)
    problems: list[str] = []
    unrouted = {t for t in tables if routes.route_of(t) is None} | {
        t for t, e in (captured.tables.items() if captured else ()) if e.ended_at is None and not e.routed_to}
    problems += [f"route target {t} is also a captured table of its own: route the shards to another name"
                 for t in sorted(set(by_target) & unrouted)]  # fmt: skip
    empty = [r.source for r in routes.rules if not any(r.matches(t) for t in tables)]
    for t in tables:
        e = captured.tables.get(t) if captured else None
        if e is None or e.ended_at is not None:
            continue
        r = routes.route_of(t)
        if (r.target if r else None) != e.routed_to:
            was = f"into {e.routed_to}" if e.routed_to else "into a Delta table of its own"
            now = f"routes now send it to {r.target}" if r else "no route selects it now"
            problems.append(f"{t} was captured {was}, and {now}: a captured table keeps its Delta table. Change "
                            "routes back, or capture the new shape with a new pipeline_id and sink_root")  # fmt: skip
    for target, shards in sorted(by_target.items()):
        schemas = {t: read_table_schema(conn, TableId.parse(t)) for t in shards}
        clash = [t for t, s in schemas.items() if any(c.name in SOURCE_COLUMNS for c in s.columns)]
        if clash:
            problems.append(f"{clash} have a column named like {list(SOURCE_COLUMNS)}, which routing adds: rename it "
                            "or do not route these tables")  # fmt: skip
        shapes = {t: ({f.name: str(f.type) for f in cdc_types.arrow_schema(s)},
                      list(s.primary_key) or list(config.chunk_key_columns.get(t) or []))
                  for t, s in schemas.items()}  # fmt: skip
        why = incompatible_shards(target, shapes)
        if why:
            problems.append(why)
    if problems:
        raise PipelineStateError("; ".join(problems))
    notes = [f"route {target}: {len(shards)} table(s) {shards[:10]}{' …' if len(shards) > 10 else ''}"
             for target, shards in sorted(by_target.items())]  # fmt: skip
    return notes + [f"route {s} matched no selected table" for s in empty]


def resolved_start(
    conn: Any, config: PipelineConfig, binlog_settings: ConnectionSettings | None, server_id: int
) -> BinlogOffset:
    """Where new tables start for ``specific-offset``, ``earliest-offset`` and ``timestamp``."""
    if config.startup_mode == "earliest-offset":
        return earliest_offset(conn)
    if config.startup_mode == "timestamp":
        if binlog_settings is None or config.startup_timestamp is None:
            raise PipelineStateError("startup_mode 'timestamp' needs the source's connection settings to read the "
                                     "binlog's event times; pass binlog_settings to plan_run")  # fmt: skip
        return offset_at_time(binlog_settings, conn, config.startup_timestamp, server_id)
    if config.start_gtid_set:
        return _gtid_start(conn, config.start_gtid_set)
    off = config.start_offset()
    assert off is not None
    return off


def _gtid_start(conn: Any, text: str) -> BinlogOffset:
    """The first transaction on this server that ``specific_offset``'s GTID set lacks."""
    info = source_server.server_info(conn)
    try:
        target = GtidSet.parse(text, info.is_mariadb)
        return position_of(conn, target, source_server.server_identity(conn, info), info)
    except (GtidSetError, GtidPositionError, BinlogUnavailableError) as exc:
        raise PipelineStateError(f"specific_offset gtid_set {text}: {exc}") from None


def check_owners(
    config: PipelineConfig, new: list[str], table_owner: Callable[[str], str | None] | None
) -> None:
    """Refuse tables whose Delta table another pipeline owns, unless they are taken over."""
    if table_owner is None:
        return
    taken = {t: o for t in new if (o := table_owner(t)) not in (None, config.pipeline_id)}
    refused = {t: o for t, o in taken.items() if t not in config.takeover_tables}
    if refused:
        owners = ", ".join(f"{t} (pipeline {o!r})" for t, o in refused.items())
        raise PipelineStateError(
            f"the Delta tables of {owners} under {config.sink_root} belong to another pipeline: two pipelines "
            "writing one table overwrite each other's rows. Use another sink_root or pipeline_id, or take them "
            f"over with takeover_tables={sorted(refused)} (they are re-snapshotted by {config.pipeline_id!r}; "
            "the other pipeline's stream then stops at its next batch, naming the new owner)"
        )
    for t, o in taken.items():
        log.warning("taking %s over from pipeline %s: it is re-snapshotted and swapped in by %s", t, o,
                    config.pipeline_id)  # fmt: skip


def check_proportions(plan: Any, config: PipelineConfig) -> None:
    """Refuse a plan whose chunk or group count is out of proportion (see config.MAX_CHUNKS_PER_TABLE)."""
    per_table: dict[str, int] = {}
    for sp in plan.splits:
        per_table[sp.table] = per_table.get(sp.table, 0) + 1
    problems = []
    if not config.allow_large_plan:
        for t, n in per_table.items():
            if n > MAX_CHUNKS_PER_TABLE:
                rows_est = n * config.chunk_size
                need = -(-rows_est // MAX_CHUNKS_PER_TABLE)
                problems.append(
                    f"{t}: {n:,} chunks of {config.chunk_size:,} rows (limit {MAX_CHUNKS_PER_TABLE:,} per table): "
                    f"raise chunk_size to {max(need, config.chunk_size * 2):,} or more, or set allow_large_plan=true"
                )
    if len(plan.groups) > MAX_MAPPED_GROUPS:
        problems.append(
            f"{len(plan.groups):,} chunk groups (one mapped snapshot task each) exceed Airflow's max_map_length "
            f"({MAX_MAPPED_GROUPS:,}): raise chunks_per_task to {-(-len(plan.splits) // MAX_MAPPED_GROUPS):,} or more"
        )
    if problems:
        raise PipelineStateError("the snapshot plan is out of proportion:\n  - " + "\n  - ".join(problems))
