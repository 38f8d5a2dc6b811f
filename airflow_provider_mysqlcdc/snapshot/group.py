"""Snapshot one chunk group with the watermark bracket around the whole group.

See docs/architecture.md, "The watermark bracket". Why the bracket sits around the group and not
each chunk: a per-chunk bracket needs the read in Python workers (pymysql), several times slower
than the readers a group can use (Spark JDBC, connectorx in Spark tasks). The bracket is exactly
as correct around a group, provided that

1. ``LW`` is not later than any chunk's SELECT view: on MariaDB it is the exact binlog position
   of a consistent snapshot taken before any read starts (every later read view sees at least as
   much);
2. every row read is materialised (staged to Parquet) before ``HW`` is taken, and never read
   from MySQL again afterwards;
3. the binlog window ``[LW, HW)`` of the group's tables is replayed onto the staged rows:
   the last image of each touched key wins (or its deletion), keys are placed into chunks in the
   database's own order, and only chunks of this group are changed.

Every chunk of the group then holds its rows as of ``HW`` and reports ``HW`` as its high
watermark; the stream emits a change to a key of the chunk iff it starts at or after ``HW``.

Where the native reader reads a chunk it also brackets that chunk on its own (a consistent
snapshot's LW just before its SELECT, HW once its rows are in memory): the same argument holds
per chunk, and the chunk's window ``[LW(chunk), HW(chunk))`` — its read, not the whole group's —
is all that is replayed onto it (``core/chunk_window.py``), and its own HW is what it reports. Its
task replays that window itself before writing the file (``snapshot/chunk_replay.py``), so a writer
spread over the table leaves the group no staged file to rewrite. Tables whose snapshot rows
carry the group's HW (metadata columns, changelog) keep the group's window.
:func:`snapshot_group` is that algorithm, one step per line; the steps live below it, the staging
in ``snapshot/staging.py`` and the replay in ``snapshot/binlog_window.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core.changelog import snapshot_to_changelog
from airflow_provider_mysqlcdc.core.chunk import ChunkGroup
from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_bytes
from airflow_provider_mysqlcdc.core.records import ChunkResult, GroupReport, StagedFile
from airflow_provider_mysqlcdc.core.row_metadata import with_snapshot_metadata
from airflow_provider_mysqlcdc.core.server_ids import ServerIdLayout
from airflow_provider_mysqlcdc.core.table import SourceSchemaError
from airflow_provider_mysqlcdc.core.throttle import read_slot_rate
from airflow_provider_mysqlcdc.mysql import server as source_server
from airflow_provider_mysqlcdc.mysql.collation import use_server_weights
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.planner import SnapshotPlan
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema, read_table_schemas
from airflow_provider_mysqlcdc.mysql.server_checks import check_server
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import replace_snapshot_rows
from airflow_provider_mysqlcdc.snapshot.binlog_window import replay_window
from airflow_provider_mysqlcdc.snapshot.staging import (
    TABLE_THREADS,
    SnapshotError,
    SnapshotTestHooks,
    TableWork,
    creating_tables,
    stage_group,
    table_work,
)
from airflow_provider_mysqlcdc.state import StateStore

log = logging.getLogger(__name__)


@dataclass
class SnapshotOptions:
    skip_backfill: bool = False  # HW = LW, no window replay: faster, at-least-once (like Flink CDC)
    fetch_size: int = 10_000
    rewrite_threads: int = 2
    # Memory for folding the binlog window and matching its keys; a window holding a huge
    # transaction is folded in buckets spilled to scratch_dir (snapshot/binlog_window.py).
    window_memory_mb: int = 512
    scratch_dir: str | None = None  # local scratch space; None = the system temp dir
    # Chunk reader: "auto" = the native Arrow reader where it can read the table exactly (see
    # snapshot/native_reader.py), else Spark JDBC; "native" = fail if it cannot; "jdbc" = always JDBC.
    reader: str = "auto"

    def __post_init__(self) -> None:
        if self.reader not in READERS:
            raise ValueError(f"reader must be one of {', '.join(READERS)}, got {self.reader!r}")


READERS = ("auto", "native", "jdbc")


@dataclass
class GroupResult:
    group_id: int
    low_watermark: BinlogOffset
    high_watermark: BinlogOffset
    chunks: list[ChunkResult]
    rows: int
    seconds: float
    window_changes: int
    read_seconds: float = 0.0  # staging: the chunks' reads (what max_rows_per_second paces)
    replayed_in_task: int = 0  # chunks whose own window their reading task replayed (chunk_replay.py)
    high_taken_at: float = 0.0  # when the HW was taken (its snapshot rows' commit time in a changelog)

    def summary(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "tables": sorted({c.table for c in self.chunks}),
            "chunks": len(self.chunks),
            "rows": self.rows,
            "low_watermark": self.low_watermark.to_dict(),
            "high_watermark": self.high_watermark.to_dict(),
            "seconds": round(self.seconds, 3),
            "read_seconds": round(self.read_seconds, 3),
            "window_changes": self.window_changes,
            "chunks_replayed_in_task": self.replayed_in_task,
            "high_taken_at": self.high_taken_at,
        }


@dataclass
class GroupRun:
    """One attempt at one group of a plan: what every step of the bracket needs to know."""

    plan_id: str
    plan: SnapshotPlan
    group: ChunkGroup
    attempt: str  # staged files go to a per-attempt location: a retry never adopts a failed attempt's files
    work: list[TableWork]  # the group's tables, prepared in the sink
    deferred: set[str]  # re-snapshotted tables: swapped in whole once every group has finished
    started: float  # time.monotonic() at the start
    server_id: int  # the binlog window reader's replication id: the group's own (core/server_ids.py)
    max_rows_per_second: float | None = None  # this group's share of the snapshot's throttle
    read_seconds: float = 0.0  # set by the staging step
    changelog: set[str] = field(default_factory=set)  # tables whose rows also go to their changelog as 'r'

    @property
    def key(self) -> str:
        """``<plan>-g<group>``: names the group in logs, staging locations and Delta commits."""
        return _group_key(self.plan_id, self.group.group_id)


def _group_key(plan_id: str, group_id: int) -> str:
    return f"{plan_id}-g{group_id:05d}"


def run_snapshot_group(
    spark: Any,
    settings: ConnectionSettings,
    store: StateStore,
    plan_id: str,
    group_id: int,
    sink: DeltaSink,
    options: SnapshotOptions | None = None,
    test_hooks: SnapshotTestHooks | None = None,
) -> GroupResult:
    """Snapshot group ``group_id`` of plan ``plan_id`` into ``sink``: what a mapped snapshot task runs."""
    started = time.monotonic()
    record = store.read_plan_record(plan_id)
    plan = SnapshotPlan.from_dict(record.snapshot_plan())
    # Re-snapshots (backfills) do not commit per group: the stream operator swaps the whole table
    # in one commit once every group has finished (DeltaSink.replace_with_files).
    deferred = set(record.deferred_commit_tables)
    if hasattr(sink, "takeover"):  # tables this plan takes over from another pipeline
        sink.takeover |= set(record.takeover_tables)
        sink.routes = record.routes  # routed shards write their share of a shared table
    groups = {g.group_id: g for g in plan.groups}
    if group_id not in groups:
        raise SnapshotError(f"plan {plan_id} has no chunk group {group_id} (it has {len(groups)} groups)")
    group = groups[group_id]
    attempt = uuid.uuid4().hex[:12]
    key = _group_key(plan_id, group_id)
    log.info("snapshot group %s: %s (attempt %s)", key, group.chunk_ranges(), attempt)
    use_server_weights(settings)  # the chunks' bounds in server-ordered collations are placed by this source
    work = table_work(plan, group.splits, sink, key, attempt, record.row_filters, record.metadata_columns)
    server_id = ServerIdLayout(settings.server_id_range, record.stream_readers).group_id(group_id)
    run = GroupRun(plan_id, plan, group, attempt, work, deferred, started, server_id)
    run.changelog = {t for t in group.tables if record.has_changelog(t)}
    if record.max_rows_per_second:  # shared by the groups that may run at once
        run.max_rows_per_second = read_slot_rate(record.max_rows_per_second,
                                                 min(len(groups), record.max_parallel_groups), 1)  # fmt: skip
    hooks = test_hooks or SnapshotTestHooks()
    return snapshot_group(spark, settings, store, sink, run, options or SnapshotOptions(), hooks)


def snapshot_group(
    spark: Any,
    settings: ConnectionSettings,
    store: StateStore,
    sink: DeltaSink,
    run: GroupRun,
    opts: SnapshotOptions,
    hooks: SnapshotTestHooks,
) -> GroupResult:
    """The watermark bracket around one group: LW, stage, HW, replay ``[LW, HW)``, commit, report."""
    g, tables = run.key, ", ".join(run.group.tables)
    for w in run.work:  # rows stamped with the group's HW take the group's window (_keep_own_windows)
        w.replay_in_task = not opts.skip_backfill and not w.metadata_columns and w.table not in run.changelog
    with _source_session(settings, run.group.group_id) as source:
        low = source.low_watermark(hooks)
        log.info("group %s: low watermark %s", g, low)

        t0 = time.monotonic()
        # the group's Delta tables are made while Spark reads its chunks (the driver only waits
        # meanwhile); nothing reads or commits them before the group's commit
        with creating_tables(sink, run.work):
            rows = stage_group(spark, settings, run.work, run.plan.collations, reader=opts.reader,
                               fetch_size=opts.fetch_size, hooks=hooks, max_rows_per_second=run.max_rows_per_second,
                               chunk_watermarks=not opts.skip_backfill)  # fmt: skip
        run.read_seconds = time.monotonic() - t0
        log.info("group %s: staged %d chunks of %s, %d rows in %.1fs (%.0f rows/s)", g, len(run.group.splits),
                 tables, rows, run.read_seconds, rows / max(run.read_seconds, 1e-9))  # fmt: skip

        high = source.high_watermark(low, run, opts.skip_backfill, hooks)
        high_taken_at = time.time()
        window_bytes = source.window_bytes(low, high)
        log.info("group %s: high watermark %s, binlog window of %d bytes", g, high, window_bytes)
    _keep_own_windows(run)

    changes = _replay_window(settings, low, high, run, window_bytes, opts)
    done = sum(len(w.replayed) for w in run.work)
    log.info("group %s: replayed the binlog window [%s, %s) onto %s: %d changes; %d of %d chunks had replayed "
             "their own window in their task", g, low, high, tables, changes, done, len(run.group.splits))  # fmt: skip
    changes += sum(c for w in run.work for c in w.replayed.values())

    _stamp_snapshot_rows(run, high, high_taken_at)
    versions = _commit(sink, run, low, high)
    _log_snapshot_rows(sink, run, high, high_taken_at)
    log.info("group %s: committed Delta versions %s; kept for the table swap: %s",
             g, versions, sorted(run.deferred.intersection(run.group.tables)) or "none")  # fmt: skip

    result = _report(store, run, low, high, changes, high_taken_at)
    log.info("snapshot group %s done: %d chunks, %d rows, %.1fs (%.0f rows/s), LW %s, HW %s, %d window changes",
             g, len(result.chunks), result.rows, result.seconds, result.rows / max(result.seconds, 1e-9),
             low, high, changes)  # fmt: skip
    return result


# ---------------------------------------------------------------------------- the steps
class _Source:
    """The group's own session with the source: both watermarks come from it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.info = source_server.server_info(conn)

    def low_watermark(self, hooks: SnapshotTestHooks) -> BinlogOffset:
        """The offset of a consistent snapshot taken before any read starts. The snapshot
        transaction only pins LW: the reads run in Spark's own sessions, so it ends at once."""
        low = source_server.begin_consistent_snapshot(self.conn, self.info)
        self.conn.commit()
        hooks.after_low_watermark()
        return low

    def high_watermark(
        self, low: BinlogOffset, run: GroupRun, skip_backfill: bool, hooks: SnapshotTestHooks
    ) -> BinlogOffset:
        """The current offset, once every row is staged (LW itself with ``skip_backfill``).

        The table definitions are checked at the same moment: the chunks were read with the plan's
        column list, so an ALTER TABLE inside the bracket would lose the new column's values (the
        stream starts after the window and never sees that DDL). Re-planning reads the new one.
        """
        hooks.before_high_watermark()
        high = source_server.gtid_offset(self.conn, low, self.info) if skip_backfill else (
            source_server.current_offset(self.conn, self.info))
        known = read_table_schemas(self.conn, [w.schema.table for w in run.work])
        for w in run.work:
            try:
                now = known.get(w.schema.table) or read_table_schema(self.conn, w.schema.table)  # the latter: why
            except SourceSchemaError as exc:
                raise SnapshotError(f"{w.table} cannot be read any more ({exc}); re-run the DAG") from None
            if now.to_dict() != w.schema.to_dict():
                raise SnapshotError(
                    f"the definition of {w.table} changed since plan {run.plan_id} was made (ALTER TABLE during "
                    "the snapshot): trigger the DAG again, so the plan step reads the new definition and snapshots "
                    "it afresh"
                )
        return high

    def window_bytes(self, low: BinlogOffset, high: BinlogOffset) -> int:
        """The binlog bytes of ``[low, high)``: sizes the replay's fold (it spills when large)."""
        return binlog_bytes(source_server.binlog_files(self.conn), low, high) if high > low else 0


@contextlib.contextmanager
def _source_session(settings: ConnectionSettings, group_id: int) -> Iterator[_Source]:
    """A connection to a source checked to be ready for CDC; closed before the window replay."""
    try:
        conn = settings.connect()
    except Exception as exc:
        raise SnapshotError(f"snapshot group {group_id}: {exc}") from exc
    try:
        problems = check_server(conn)
        if problems:
            raise SnapshotError("the source is not ready for CDC: " + "; ".join(p.message for p in problems))
        yield _Source(conn)
    finally:
        conn.close()


def _replay_window(
    settings: ConnectionSettings,
    low: BinlogOffset,
    high: BinlogOffset,
    run: GroupRun,
    window_bytes: int,
    opts: SnapshotOptions,
) -> int:
    """Bring the staged rows to HW (``snapshot/binlog_window.py``); the number of changes replayed."""
    if not high > low:
        return 0
    try:
        return replay_window(
            settings, low, high, run.work, server_id=run.server_id, window_bytes=window_bytes,
            memory_bytes=opts.window_memory_mb << 20, scratch_dir=opts.scratch_dir, threads=opts.rewrite_threads,
        )  # fmt: skip
    except Exception as exc:
        raise SnapshotError(_explain_binlog_error(exc)) from exc


def _keep_own_windows(run: GroupRun) -> None:
    """Drop the chunks' own windows of tables whose snapshot rows are stamped with the group's HW
    (metadata columns, changelog 'r' rows): those chunks must be exact as of that HW, so they take
    the group's window. The group's window holds every chunk's, so this is always correct."""
    for w in run.work:
        if w.windows and (w.metadata_columns or w.table in run.changelog):
            w.windows = {}
    own = [hw.pos - lw.pos for w in run.work for lw, hw in w.windows.values() if lw.file == hw.file]
    if own:
        log.info("group %s: %d of %d chunks bracketed by their own watermarks (median window: %d bytes of binlog)",
                 run.key, sum(len(w.windows) for w in run.work), len(run.group.splits), sorted(own)[len(own) // 2])


def _commit(sink: DeltaSink, run: GroupRun, low: BinlogOffset, high: BinlogOffset) -> dict[str, int]:
    """One Delta commit per table adopting its staged files (replacing an earlier attempt's);
    a re-snapshotted table's files wait for the table swap. Returns the versions committed."""
    metadata = {"plan_id": run.plan_id, "group_id": run.group.group_id,
                "low_watermark": str(low), "high_watermark": str(high)}  # fmt: skip
    for w in run.work:
        if w.table in run.deferred:
            log.info("%s: %d staged files kept for the table swap after the last group", w.table, len(_nonempty(w)))
    todo = [w for w in run.work if w.table not in run.deferred]

    def commit(w: TableWork) -> int:
        return sink.commit_snapshot_group(w.table, run.key, _nonempty(w), w.lake_schema, metadata)

    # tables are independent: their commits run side by side (delta-rs releases the GIL)
    with ThreadPoolExecutor(max_workers=min(TABLE_THREADS, max(1, len(todo)))) as pool:
        return dict(zip([w.table for w in todo], pool.map(commit, todo), strict=True))


def _stamp_snapshot_rows(run: GroupRun, high: BinlogOffset, taken_at: float) -> None:
    """Give each staged row of a table with ``metadata_columns`` op 'r' at the group's HW: a
    rewrite of its staged files, since the HW is known only after they were read
    (docs/architecture.md, "Metadata columns")."""
    for w in run.work:
        if not w.metadata_columns:
            continue
        t0 = time.monotonic()
        for sid, f in list(w.files.items()):
            if f.rows:
                rows = with_snapshot_metadata(w.storage.read_parquet(f.path), high, taken_at).cast(w.lake_schema)
                w.files[sid] = StagedFile(f.path, f.rows, w.storage.write_parquet(rows, f.path), f.split_ids)
        log.info("group %s: %s: metadata columns written for %d rows in %.1fs", run.key, w.table, w.rows,
                 time.monotonic() - t0)  # fmt: skip


def _log_snapshot_rows(sink: DeltaSink, run: GroupRun, high: BinlogOffset, taken_at: float) -> None:
    """The group's rows of each table with a changelog, as op 'r' at the group's HW; a retried group
    replaces its earlier attempt's rows (docs/architecture.md, "Changelog")."""
    tx_id = f"snapshot:{run.plan_id}:{run.group.group_id}"
    for w in run.work:
        if w.table not in run.changelog:
            continue
        files = _nonempty(w)
        rows = (snapshot_to_changelog(sink.storage.read_parquet(f.path), w.arrow_schema, high, taken_at, tx_id)
                for f in files)  # fmt: skip
        n = replace_snapshot_rows(sink, w.table, w.arrow_schema, rows, tx_id)
        log.info("group %s: %s: %d snapshot rows in the changelog", run.key, w.table, n)


def _report(
    store: StateStore, run: GroupRun, low: BinlogOffset, high: BinlogOffset, changes: int, high_taken_at: float
) -> GroupResult:
    """Every chunk reports its own LW and HW where it has them, else the group's; one group report in
    the state store."""
    secs = time.monotonic() - run.started
    gid = run.group.group_id
    chunks = []
    for w in run.work:
        for s in w.splits:
            f = w.files.get(s.split_id)
            lw, hw = w.windows.get(s.split_id, (low, high))
            chunks.append(ChunkResult(w.table, s.split_id, gid, lw, hw, f.rows if f else 0, round(secs, 3)))
    result = GroupResult(gid, low, high, chunks, sum(c.rows for c in chunks), secs, changes, run.read_seconds,
                         sum(len(w.replayed) for w in run.work), high_taken_at)  # fmt: skip
    staged = {w.table: _nonempty(w) for w in run.work if w.table in run.deferred}
    store.write_group_report(run.plan_id, GroupReport(gid, chunks, result.summary(), run.attempt, staged))
    return result


def _nonempty(w: TableWork) -> list[StagedFile]:
    return [f for f in w.files.values() if f.rows > 0]


def _explain_binlog_error(exc: Exception) -> str:
    text = str(exc)
    if "1227" in text or "REPLICATION SLAVE" in text.upper() or "Access denied" in text:
        return (
            "reading the binlog window failed: the CDC user lacks REPLICATION SLAVE. GRANT REPLICATION SLAVE ON *.* "
            f"TO <cdc user> ({text[:200]})"
        )
    return f"reading the binlog window failed: {text[:500]}"


__all__ = [
    "GroupResult",
    "GroupRun",
    "SnapshotError",
    "SnapshotOptions",
    "SnapshotTestHooks",
    "run_snapshot_group",
    "snapshot_group",
]
