"""The steps of a pipeline run, shared by the operators and the CLI: plan it, then finalize it.

**Plan** (``plan_run``) checks the source, reads what the pipeline already captures (the stream
manifest) and decides per table: snapshot it (new table, or asked for a re-snapshot), start it at
an offset (``latest-offset`` / ``specific-offset``), or leave it alone (already captured — never
re-read). It refuses plans out of proportion (tiny chunks, more than ``MAX_CHUNKS_PER_TABLE``
chunks) and tables whose Delta table another pipeline owns. The stream keeps running meanwhile, so
the captured tables stay current while new or re-snapshotted ones are read (a re-snapshot is staged
and swapped in whole at the end; the stream writes the old table until then).

**Finalize** (``finalize_run``) runs after every snapshot group: it builds the new tables' manifest
entries from the chunk results (refusing if any chunk lacks one), pauses the stream after its
running batch (its committed offset is P; the Spark application stays up), swaps re-snapshotted
tables into the sink in one commit each, merges the entries into the stream manifest and resumes
the stream, which restarts its query with the new manifest — a pause of seconds, not a restart. If
every new chunk's high watermark is >= P the stream resumes from its checkpoint. Otherwise — the
stream ran on while the new tables were snapshotted — it starts a new *generation* from min(P, new
HWs) with a checkpoint and a Delta transaction app id of its own, and every chunk of the tables it
already captured gets HW = max(HW, P): their changes before P, already applied, are filtered out,
and none after P is missed; the new tables' changes pass from their own HWs. Both steps are
idempotent, so retries are safe.

State store layout used here (besides ``state.py``'s)::

    current_plan.json        what the last run set out to do (``PlanPointer``, core/plan_record.py)
    plans/<id>/plan.json     the snapshot plan plus the run's decisions (``PlanRecord``, same module)
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.capture_selection import CaptureSelection
from airflow_provider_mysqlcdc.core.config import RESOLVED_START_MODES, PipelineConfig
from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, FinishedChunk, Manifest
from airflow_provider_mysqlcdc.core.manifest_build import build_manifest, offset_table, partial_backfill_chunks
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.plan_record import OffsetStart, PlanPointer, PlanRecord
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.row_metadata import lake_schema
from airflow_provider_mysqlcdc.core.server_ids import ServerIdLayout, ServerIdRangeError
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.failover import FailoverError, follow_failover, offsets_here
from airflow_provider_mysqlcdc.handover_changelog import Reread, log_removed_rows, logged_chunks, logged_through
from airflow_provider_mysqlcdc.mysql import server as source_server
from airflow_provider_mysqlcdc.mysql.connection import DEFAULT_SERVER_ID_RANGE, ConnectionSettings
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot, with_repaired_chunks
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError
from airflow_provider_mysqlcdc.mysql.splitter import load_collations
from airflow_provider_mysqlcdc.mysql.table_choice import TableChoice, choose_tables
from airflow_provider_mysqlcdc.plan_rules import (
    MAX_MAPPED_GROUPS,
    PipelineStateError,
    check_changelog_location,
    check_metadata_columns,
    check_owners,
    check_proportions,
    check_reserved_columns,
    check_routes,
    chosen_repairs,
    purged_restart,
    resolved_start,
)
from airflow_provider_mysqlcdc.sinks.delta_chunk_swap import swap_chunk_rows, swap_keyed_rows
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import (
    SCHEMA_CHANGE,
    checkpoint_offset,
    pause_stream,
    resume_stream,
    stream_state,
    wait_until_applied,
)

log = logging.getLogger(__name__)

def new_plan_id(run_id: str | None = None) -> str:
    """A state-store-safe, unique, time-ordered id; carries the Airflow run id when there is one."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    kind = (run_id or "manual").split("__")[0]  # Airflow run ids are "<type>__<timestamp>"
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", kind)[:30].strip("_.-") or "run"
    return f"{stamp}-{base}-{uuid.uuid4().hex[:6]}"


@dataclass
class PlanOutcome:
    plan_id: str
    groups: list[dict[str, Any]]  # small descriptors, one per chunk group, for task mapping
    snapshot_tables: list[str]
    offset_tables: list[str]
    resnapshot_tables: list[str]
    unchanged_tables: list[str]
    chunks: int = 0
    stopped_stream: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    choice: TableChoice | None = None  # what the table selection matched, skipped and excluded
    repair_chunks: dict[str, list[int]] = field(default_factory=dict)  # table -> chunks re-snapshotted

    def describe(self, pipeline_id: str) -> str:
        """What the run does, in one line: 'pipeline shop: snapshot shop.x; re-snapshot shop.y'."""
        parts = []
        for what, tables in (("snapshot", [t for t in self.snapshot_tables if t not in self.resnapshot_tables]),
                             ("re-snapshot", self.resnapshot_tables), ("start at an offset", self.offset_tables)):
            if tables:
                parts.append(f"{what} {', '.join(tables)}")
        if self.repair_chunks:
            parts.append("repair " + ", ".join(f"{t} chunks {ids}" for t, ids in self.repair_chunks.items()))
        if not parts:
            parts.append(f"nothing new ({len(self.unchanged_tables)} table(s) captured)")
        return f"pipeline {pipeline_id}: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "selected_tables": self.choice.to_dict() if self.choice else None,
            "plan_id": self.plan_id,
            "groups": len(self.groups),
            "chunks": self.chunks,
            "snapshot_tables": self.snapshot_tables,
            "offset_tables": self.offset_tables,
            "resnapshot_tables": self.resnapshot_tables,
            "repair_chunks": self.repair_chunks,
            "unchanged_tables": self.unchanged_tables,
            "stopped_stream": bool(self.stopped_stream and self.stopped_stream.get("stopped")),
            "notes": self.notes,
        }


def plan_run(
    conn: Any,
    store: StateStore,
    config: PipelineConfig,
    plan_id: str,
    sink_exists: Callable[[str], bool],
    stop_timeout: float = 300.0,
    table_owner: Callable[[str], str | None] | None = None,
    airflow_run_id: str | None = None,
    server_id_range: tuple[int, int] = DEFAULT_SERVER_ID_RANGE,
    binlog_settings: ConnectionSettings | None = None,
) -> PlanOutcome:
    """Check, decide, split, and record the plan. See the module doc.

    ``table_owner`` tells which pipeline owns an existing Delta table (``DeltaSink.owner_of``);
    ``airflow_run_id`` is recorded in the plan so a plan can be matched to its DAG run.
    ``server_id_range`` is the connection's: it must hold ``config.stream_readers`` plus
    ``config.max_parallel_groups`` ids, and the plan makes no more groups than its snapshot block
    has ids, so every group's binlog window reader has its own (``core/server_ids.py``).
    ``binlog_settings`` (the source's connection settings) let ``startup_mode`` ``timestamp`` read
    event times from the binlog, with the first snapshot group's server_id (no group runs yet).
    """
    try:
        server_ids = ServerIdLayout(server_id_range, config.stream_readers)
        server_ids.check(config.max_parallel_groups)
    except ServerIdRangeError as exc:
        raise PipelineStateError(str(exc)) from None
    choice = choose_tables(conn, config.selection, config.chunk_key_columns)
    report, tables = choice.report, choice.tables
    manifest, lost = _manifest_here(conn, store, config, stop_timeout)
    # a table whose capture ended at a DROP/RENAME (schema-change policy) and that is selected again
    # (re-created, or renamed in) is read again and swapped into its Delta table
    ended = set(manifest.ended_tables()) if manifest else set()
    captured = set(manifest.tables) - ended if manifest else set()
    new = [t for t in tables if t not in captured and t not in ended]
    check_owners(config, new, table_owner)
    backfill = [t for t in tables if t in ended or (t in config.resnapshot_tables and t in captured)]
    recover = purged_restart(conn, store, manifest, config, tables, lost)
    if recover:  # every captured table, read again; the stream restarts from the new snapshots
        backfill = sorted(captured)
    # the check's warnings (e.g. tables the engine changes without a binlog event) reach the log
    notes = [f"source check warning: {w.message}" for w in report.warnings] + list(config.notes) + choice.notes() + [
        f"{t} is in resnapshot_tables but not captured yet: it is snapshotted as a new table"
        for t in config.resnapshot_tables
        if t not in captured
    ]
    if manifest:
        notes.extend(f"{t} is captured again: it was dropped or renamed away, and a table of that name is selected "
                     "(snapshotted again and swapped into its Delta table)" for t in sorted(ended & set(tables)))
        notes.extend(f"{t} is no longer captured since its DROP/RENAME at {manifest.tables[t].ended_at}; its Delta "
                     "table stays" for t in sorted(ended - set(tables)))
        dropped = sorted(captured - set(tables))
        if dropped:
            notes.append(
                f"{dropped} are captured but not in tables: they stay captured (the stream keeps them up to date)"
            )
    snapshot_tables = [t for t in tables if t in new or t in backfill] if config.snapshots else []
    offset_tables = [] if config.snapshots else new
    repairs = chosen_repairs(config, manifest, snapshot_tables, notes, conn)
    check_metadata_columns(config, manifest, tables)
    check_changelog_location(config, tables)
    notes += check_routes(conn, config, manifest, tables)
    unchanged = [t for t in tables if t not in snapshot_tables and t not in offset_tables and t not in repairs]

    # The stream keeps running while tables are (re-)snapshotted: finalize_run pauses it for the
    # hand-over only (a re-snapshot is swapped in whole there, while the stream is paused).
    stopped = None
    record = PlanRecord()
    if snapshot_tables or repairs:
        max_groups = min(MAX_MAPPED_GROUPS, server_ids.max_groups)
        plan = plan_snapshot(
            conn, snapshot_tables, config.chunk_size, config.chunks_per_task, config.chunk_key_columns, max_groups
        ) if snapshot_tables else None  # fmt: skip
        if repairs:
            assert manifest is not None
            try:
                plan = with_repaired_chunks(plan, manifest.tables, repairs, manifest.collations,
                                            config.chunks_per_task, max_groups)  # fmt: skip
            except ValueError as exc:
                raise PipelineStateError(str(exc)) from None
        if max_groups < MAX_MAPPED_GROUPS and len(plan.splits) > max_groups * config.chunks_per_task:
            notes.append(
                f"{len(plan.splits)} chunks packed into {max_groups} groups (more than chunks_per_task="
                f"{config.chunks_per_task} each): server_id_range {server_ids.lo}-{server_ids.hi} has "
                f"{server_ids.max_groups} ids for snapshot groups; widen it for more, smaller groups"
            )
        check_proportions(plan, config)
        check_reserved_columns(config, plan.tables)
        record = PlanRecord.from_dict(plan.to_dict())
        groups = [{"plan_id": plan_id, "group_id": g.group_id, "group_label": g.label(),
                   "group_chunks": g.chunk_ranges()} for g in plan.groups]  # fmt: skip
        chunks = len(plan.splits)
    else:
        groups, chunks = [], 0

    offsets: dict[str, OffsetStart] = {}
    if offset_tables:
        if config.startup_mode in RESOLVED_START_MODES:
            off = resolved_start(conn, config, binlog_settings, server_ids.group_id(0))
            source_server.ensure_offset_available(conn, off)
            ckpt = checkpoint_offset(store)
            if ckpt is not None and off < ckpt:
                mode = config.startup_mode
                what = "specific_offset" if mode == "specific-offset" else f"the {mode} start"
                raise PipelineStateError(
                    f"{what} {off} is before the stream's checkpoint {ckpt}: the stream resumes from its "
                    "checkpoint, so changes of the new tables before it would be skipped. Use an offset at or "
                    f"after {ckpt}, or startup_mode=initial to snapshot them"
                )
        else:
            off = source_server.current_offset(conn)
        off = source_server.gtid_offset(conn, off)
        cache: dict[str, Any] = {}
        for t in offset_tables:
            schema = read_table_schema(conn, TableId.parse(t))
            check_reserved_columns(config, {t: schema})
            key = schema.chunk_key(config.chunk_key_columns.get(t))
            collations = load_collations(conn, key, cache)
            offsets[t] = OffsetStart(
                off, schema.to_dict(), [k.to_dict() for k in key], {k: v.to_dict() for k, v in collations.items()}
            )
        log.info("tables %s start at offset %s with no snapshot (%s)", offset_tables, off, config.startup_mode)

    record = replace(
        record,
        pipeline=config.to_dict(),
        plan_id=plan_id,
        created_at=time.time(),
        snapshot_tables=snapshot_tables + list(repairs),
        resnapshot_tables=backfill,
        repair_chunks=repairs,
        recover_purged=recover,
        takeover_tables=[t for t in config.takeover_tables if t in snapshot_tables],
        airflow_run_id=airflow_run_id,
        # A table whose Delta table already exists (a backfill, or an earlier run that failed
        # half-way) is swapped in one commit at the end, never committed group by group.
        deferred_commit_tables=[t for t in [*snapshot_tables, *repairs] if sink_exists(t)],
        offset_tables=offsets,
        skip_backfill=config.skip_backfill,
        finalized=False,
    )
    store.write_plan_record(plan_id, record)
    store.write_plan_pointer(
        PlanPointer(plan_id, snapshot_tables + list(repairs) + offset_tables, finalized=False, at=time.time(),
                    airflow_run_id=airflow_run_id)
    )  # fmt: skip
    for n in notes:
        log.warning(n)
    log.info(
        "plan %s: snapshot %s (%d chunks in %d groups), start at offset %s, already captured %s",
        plan_id, snapshot_tables or "nothing", chunks, len(groups), offset_tables or "none", unchanged or "none",
    )
    return PlanOutcome(plan_id, groups, snapshot_tables, offset_tables, backfill, unchanged, chunks, stopped, notes,
                       choice, repairs)


def _manifest_here(conn: Any, store: StateStore, config: PipelineConfig, stop_timeout: float
                   ) -> tuple[Manifest | None, str | None]:  # fmt: skip
    """The manifest with its offsets on the server ``conn`` reaches (``failover.follow_failover``),
    and why the stream cannot resume there if it cannot and ``recover_purged`` re-snapshots."""
    try:
        return follow_failover(conn, store, stop_timeout), None
    except (FailoverError, BinlogUnavailableError) as exc:
        if not config.recover_purged:
            raise PipelineStateError(str(exc)) from None
        return store.read_manifest(), str(exc)


@dataclass
class FinalizeOutcome:
    plan_id: str
    added: list[str]
    resnapshotted: list[str]
    start_offset: dict[str, Any] | None
    checkpoint_offset: dict[str, Any] | None
    tables: list[str]
    new_generation: int | None = None
    reloaded: bool = False  # the running stream was paused and resumed with the new manifest
    repaired: dict[str, list[int]] = field(default_factory=dict)  # table -> chunks swapped in

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def finalize_run(
    store: StateStore,
    sink: Any,
    plan_id: str,
    summaries: list[dict[str, Any]] | None = None,
    stop_timeout: float = 300.0,
    settings: ConnectionSettings | None = None,
) -> FinalizeOutcome:
    """Turn a finished plan into stream manifest entries; swap re-snapshotted tables in. Idempotent:
    a plan finalized before (a retried stream task) is not merged again — the manifest may have
    moved on since (a followed schema change, a later generation) and must not be rolled back.
    ``settings`` (the source) are needed when a table with a changelog is read again: its rows the
    source lost without a binlog event are told apart by a binlog read (``handover_changelog.py``)."""
    record = store.read_plan_record(plan_id)
    if record.finalized:
        log.info("plan %s was finalized before; the manifest is left as it is", plan_id)
        pending = store.read_reload()
        run = store.read_run()
        if pending is not None and pending.requested and run is not None and run.state == "paused":
            # finalized, but the run died before it let the paused stream go on
            resume_stream(store, pending.reload_id, timeout=stop_timeout)
        return FinalizeOutcome(**(record.finalize_outcome or {}))
    # the tables this plan takes over from another pipeline may be swapped in by this sink
    if hasattr(sink, "takeover"):
        sink.takeover |= set(record.takeover_tables)
        sink.routes = record.routes
    group_ids = record.group_ids
    if summaries is not None:
        seen = {int(s["group_id"]) for s in summaries if s}
        missing = sorted(set(group_ids) - seen)
        if missing:
            raise PipelineStateError(
                f"snapshot groups {missing} of plan {plan_id} reported no summary through XCom: they did not "
                "finish. Clear and re-run those mapped snapshot task instances"
            )
    old = store.read_manifest()
    new_tables: dict[str, CapturedTable] = {}
    repaired: dict[str, CapturedTable] = {}  # only the repaired chunks, with their new HWs
    collations: dict[str, Collation] = {}
    if group_ids:
        part = build_manifest(record.snapshot_plan(), store.read_all_results(plan_id))  # names chunks without results
        for t, entry in part.tables.items():
            (repaired if t in record.repair_chunks else new_tables)[t] = entry
        collations.update(part.collations)
    for t, o in record.offset_tables.items():
        schema = o.table_schema()
        new_tables[t] = offset_table(schema, o.key_columns, o.offset)
        collations.update(o.collation_objects())
        sink.prepare_table(t, lake_schema(cdc_types.arrow_schema(schema), record.metadata_columns),
                           new_tables[t].merge_key)  # fmt: skip
    for t, entry in new_tables.items():  # a routed shard's Delta table is its route's target
        route = record.routes.route_of(t)
        entry.routed_to = route.target if route else None

    if settings is not None and not record.recover_purged:  # a failover since the plan: all offsets onto one server
        old, new_tables, repaired = _offsets_here(settings, store, old, new_tables, repaired, stop_timeout)
    # changelog_tables switched on or off for tables already captured: the stream takes it at a hand-over
    logged = {t for t, e in old.tables.items() if e.changelog != record.has_changelog(t)} if old else set()
    rereads = _logged_rereads(old, record, new_tables, repaired)
    paused: dict[str, Any] = {}
    if (new_tables or repaired or logged) and stream_state(store)["running"]:
        if rereads:  # a changelog's re-read chunks: their changes up to H logged by this generation
            _let_stream_pass(store, max(c.high_watermark for cs in rereads.values() for c in cs), stop_timeout)
        log.info("pausing the stream to hand %s over to it", sorted({*new_tables, *repaired, *logged}))
        paused = pause_stream(store, timeout=stop_timeout)
    ckpt = checkpoint_offset(store, old)
    reports = [r for r in (store.read_group_report(plan_id, g) for g in group_ids) if r is not None]

    def staged(t: str) -> list[StagedFile]:
        return [f for r in reports for f in r.staged_files.get(t, [])]

    if old is not None and rereads:
        _log_removed_rows(sink, settings, record, old, {**old.collations, **collations}, rereads, staged, reports,
                          ckpt or old.start_offset)  # fmt: skip
        if not record.recover_purged:  # (its old checkpoint is purged: the stream restarts from the snapshots)
            reached = ckpt or old.start_offset
            for t in set(rereads) - set(record.row_filters):  # a partial backfill's HWs are min(H, P) already
                fresh = repaired if t in repaired else new_tables
                fresh[t] = replace(fresh[t], chunks=logged_chunks(fresh[t].chunks, reached))

    for t in record.deferred_commit_tables:
        schema = record.table_schema(t)
        lake = lake_schema(cdc_types.arrow_schema(schema), record.metadata_columns)
        files = staged(t)
        if t in repaired and old is not None and t in record.row_filters:
            meta = {"plan_id": plan_id, "snapshot_filter": record.row_filters[t]}
            swap_keyed_rows(sink, t, old.tables[t], files, lake, meta)
            repaired[t] = replace(repaired[t], chunks=partial_backfill_chunks(
                repaired[t].chunks, old.tables[t].chunks, ckpt))  # fmt: skip
            continue
        if t in repaired and old is not None:
            meta = {"plan_id": plan_id, "repair_chunks": record.repair_chunks[t]}
            swap_chunk_rows(sink, t, old.tables[t], old.collations, record.repair_chunks[t], files,
                            lake, meta)  # fmt: skip
            continue
        meta = {"plan_id": plan_id, "re_snapshot": True}
        sink.replace_with_files(t, files, lake, meta)

    manifest = old
    new_generation = None
    if new_tables or repaired or logged:
        manifest = old.merged(new_tables, collations) if old else Manifest.of(new_tables, collations)
        for t, entry in repaired.items():
            manifest = manifest.with_chunks(t, entry.chunks)
        manifest = manifest.with_changelogs({t: record.has_changelog(t) for t in manifest.tables})
        manifest = manifest.with_metadata_columns([*new_tables, *repaired], record.metadata_columns)
        if logged:
            log.info("changelog switched %s", {t: "on" if record.has_changelog(t) else "off" for t in sorted(logged)})
        fresh = {**new_tables, **repaired}
        early = [t for t, e in fresh.items() if ckpt is not None and e.min_high_watermark < ckpt]
        if record.recover_purged:  # the old checkpoint's offset is gone: start over from the new snapshots
            manifest = manifest.restarted(store.pipeline_id)
            new_generation = manifest.generation.number
            log.info("recovering from a purged binlog: stream generation %d starts from %s", new_generation,
                     manifest.start_offset)  # fmt: skip
        elif old is not None and ckpt is not None and early:
            manifest = manifest.handed_over(store.pipeline_id, ckpt, new_tables,
                                            {t: record.repair_chunks[t] for t in repaired})  # fmt: skip
            new_generation = manifest.generation.number
            log.info(
                "the stream ran past the snapshot of %s (checkpoint %s): stream generation %d starts from the "
                "earliest new high watermark; the captured tables' changes before %s are filtered out",
                early, ckpt, new_generation, ckpt,
            )
        if old is not None and ckpt is not None:  # a new generation must not log twice what these logged
            for t in (t for t, e in old.tables.items() if e.changelog and t in manifest.tables):
                manifest = manifest.with_changelog_from([t], logged_through(store, sink, old, t, ckpt))
        # what the stream captures when a table is created while it runs: this run's selection
        manifest.selection = CaptureSelection.from_dict(record.pipeline)
        store.write_manifest(manifest)
    _forget_schema_changes(store, set(new_tables))
    added = [t for t in new_tables if not old or t not in old.tables]
    out = FinalizeOutcome(
        plan_id=plan_id,
        added=added,
        repaired={t: record.repair_chunks[t] for t in repaired},
        resnapshotted=[t for t in new_tables if t not in added],
        start_offset=None if manifest is None else manifest.start_offset.to_dict(),
        checkpoint_offset=None if ckpt is None else ckpt.to_dict(),
        tables=sorted(manifest.tables) if manifest else [],
        new_generation=new_generation,
    )
    store.write_plan_record(plan_id, replace(record, finalized=True, finalize_outcome=out.to_dict()))
    pointer = store.read_plan_pointer()
    if pointer is not None and pointer.plan_id == plan_id:
        store.write_plan_pointer(replace(pointer, finalized=True))
    if paused.get("paused"):
        t0 = time.monotonic()
        resume_stream(store, paused["reload_id"], timeout=stop_timeout)
        out.reloaded = True
        log.info("the stream resumed with the new manifest in %.1fs", time.monotonic() - t0)
    log.info(
        "plan %s finalized: added %s, re-snapshotted %s, repaired chunks %s; the stream captures %s",
        plan_id, out.added or "none", out.resnapshotted or "none", out.repaired or "none", out.tables,
    )
    return out


def _offsets_here(
    settings: ConnectionSettings, store: StateStore, old: Manifest | None, new: dict[str, CapturedTable],
    repaired: dict[str, CapturedTable], stop_timeout: float,
) -> tuple[Manifest | None, dict[str, CapturedTable], dict[str, CapturedTable]]:
    """The manifest and this plan's new entries with their offsets on the server the source
    connection reaches now (``failover.py``): a failover between plan and finalize leaves the
    manifest and some groups' high watermarks naming the old server's binlog."""
    conn = settings.connect()
    try:
        return follow_failover(conn, store, stop_timeout) or old, offsets_here(conn, new), offsets_here(conn, repaired)
    except FailoverError as exc:
        raise PipelineStateError(str(exc)) from None
    finally:
        conn.close()


def _logged_rereads(
    old: Manifest | None, record: PlanRecord, new_tables: dict[str, CapturedTable], repaired: dict[str, CapturedTable]
) -> dict[str, list[FinishedChunk]]:
    """The tables with a changelog that this plan reads again (re-snapshot, repair, partial
    backfill, recovery), with the chunks it read and their HWs (``handover_changelog.py``)."""
    if old is None:
        return {}
    out = {}
    for t, entry in {**new_tables, **repaired}.items():
        before = old.tables.get(t)
        if before is not None and before.changelog and before.ended_at is None and record.has_changelog(t):
            out[t] = list(entry.chunks)
    return out


def _let_stream_pass(store: StateStore, target: BinlogOffset, timeout: float) -> None:
    """Wait (at most ``timeout``) for the running stream to apply everything before ``target``, the
    re-read's latest HW: then the pause point P lies after every re-read chunk's H, and the old
    generation has logged their changes up to it. A stream that stops or lags is not waited for
    (``handover_changelog.logged_chunks`` covers an H after P)."""
    log.info("waiting for the stream to reach %s, the high watermark of the tables read again, before the pause",
             target)  # fmt: skip
    try:
        wait_until_applied(store, target, timeout=timeout)
    except (TimeoutError, RuntimeError) as exc:
        log.warning("the stream did not reach %s (%s): pausing it where it is", target, exc)


def _log_removed_rows(
    sink: Any,
    settings: ConnectionSettings | None,
    record: PlanRecord,
    old: Manifest,
    collations: dict[str, Collation],
    rereads: dict[str, list[FinishedChunk]],
    staged: Callable[[str], list[StagedFile]],
    reports: list[Any],
    pause: BinlogOffset,
) -> None:
    """Before the swaps: each re-snapshotted or repaired table's rows the source lost without a
    binlog event, as op ``d`` in its changelog (a partial backfill reads only what its filter selects,
    so a row it does not find is not gone)."""
    taken_at = {BinlogOffset.from_dict(r.summary["high_watermark"]): float(r.summary["high_taken_at"])
                for r in reports if r.summary.get("high_taken_at")}  # fmt: skip
    for t, chunks in rereads.items():
        if t in record.row_filters:
            continue
        before = old.tables[t]
        located = before.chunks if t in record.repair_chunks else chunks
        reread = Reread(t, before, located, {c.chunk.split_id: c.high_watermark for c in chunks}, staged(t))
        try:
            log_removed_rows(sink, settings, record.plan_id, reread, collations, pause, taken_at,
                             binlog_kept=not record.recover_purged)  # fmt: skip
        except ValueError as exc:
            raise PipelineStateError(str(exc)) from None


def _forget_schema_changes(store: StateStore, tables: set[str]) -> None:
    """A DDL the stream stopped on is moot for a table just re-snapshotted (its new chunks' HWs are
    after the DDL, so the stream's filter drops it too)."""
    rec = store.read_schema_change()
    if rec is None:
        return
    left = [c for c in rec.changes if c.table not in tables]
    if left:
        store.write_schema_change(replace(rec, changes=left))
    else:
        store.delete(SCHEMA_CHANGE)
        log.info("the DDL the stream stopped on is covered by the re-snapshot of %s", sorted(tables))
