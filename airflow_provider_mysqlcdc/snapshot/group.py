"""Snapshot one split group with the watermark bracket around the whole group (DESIGN §3).

Why the bracket sits around the group and not each chunk: a per-chunk bracket needs the read in
Python workers (pymysql decodes ~165k rows/s per core), which caps the snapshot near a quarter of
what Spark's JDBC reader does on the same machine. The bracket is exactly as correct around a
group, provided that

1. ``LW_g`` is not later than any chunk's SELECT view: on MariaDB it is the exact binlog position
   of a consistent snapshot taken before any read starts (every later read view sees at least as
   much);
2. every row read is materialised (staged to Parquet) before ``HW_g`` is taken, and never read
   from MySQL again afterwards;
3. the binlog window ``[LW_g, HW_g)`` of the group's tables is replayed onto the staged rows:
   the last image of each touched key wins (or its deletion), keys are placed into chunks in the
   database's own order, and only chunks of this group are changed.

Every chunk of the group then holds its rows as of ``HW_g`` and reports ``HW_g`` as its high
watermark; the stream emits a change to a key of the chunk iff it starts at or after ``HW_g``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_mysqlcdc.core import projection
from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator, SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import KeyColumn
from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_bytes
from airflow_provider_mysqlcdc.core.predicate import quote_ident, split_condition, sql_literal
from airflow_provider_mysqlcdc.core.records import ChunkResult, GroupReport, StagedFile
from airflow_provider_mysqlcdc.core.table import SourceSchemaError, TableSchema
from airflow_provider_mysqlcdc.mysql import jdbc as mysql_jdbc
from airflow_provider_mysqlcdc.mysql import server as source_server
from airflow_provider_mysqlcdc.mysql.checks import check_server
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.planner import SnapshotPlan
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.binlog_window import replay_window
from airflow_provider_mysqlcdc.snapshot.native_reader import native_reader_unavailable, stage_chunks
from airflow_provider_mysqlcdc.state import StateStore

log = logging.getLogger(__name__)

_PART = re.compile(r"part-(\d+)-")


class SnapshotError(RuntimeError):
    """The snapshot of a group failed; the message says why and what to do. Nothing was committed."""


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
class SnapshotTestHooks:
    """Deterministic interleavings for tests: callables run at each point of the algorithm.

    ``stall_reads_at`` makes the SELECT of a table pause (server-side ``SLEEP``) when it reaches a
    key, so ``during_read`` runs while that SELECT is in flight. Not for production use.
    """

    after_low_watermark: Callable[[], None] | None = None
    during_read: Callable[[], None] | None = None
    before_high_watermark: Callable[[], None] | None = None
    stall_reads_at: dict[str, tuple[tuple[Any, ...], float]] = field(default_factory=dict)


@dataclass
class GroupResult:
    group_id: int
    low_watermark: BinlogOffset
    high_watermark: BinlogOffset
    chunks: list[ChunkResult]
    rows: int
    seconds: float
    window_changes: int

    def summary(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "tables": sorted({c.table for c in self.chunks}),
            "chunks": len(self.chunks),
            "rows": self.rows,
            "low_watermark": self.low_watermark.to_dict(),
            "high_watermark": self.high_watermark.to_dict(),
            "seconds": round(self.seconds, 3),
            "window_changes": self.window_changes,
        }


@dataclass
class _TableWork:
    table: str
    schema: TableSchema
    arrow_schema: pa.Schema
    splits: list[SnapshotChunk]  # this group's chunks of the table
    locator: ChunkLocator  # over ALL chunks of the table (keys may move to other groups' chunks)
    pk_cols: list[str]
    chunk_cols: list[str]
    staging: str = ""
    files: dict[int, StagedFile] = field(default_factory=dict)  # split_id -> staged file


def _progress_logger(spark: Any, label: str, total: int, stop: threading.Event) -> None:
    tracker = spark.sparkContext.statusTracker()
    t0 = time.monotonic()
    while not stop.wait(5.0):
        done = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
        log.info("%s: %d/%d chunks read, %.0fs", label, done, total, time.monotonic() - t0)


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
    opts = options or SnapshotOptions()
    hooks = test_hooks or SnapshotTestHooks()
    t0 = time.monotonic()
    raw_plan = store.read_plan(plan_id)
    plan = SnapshotPlan.from_dict(raw_plan)
    # Re-snapshots (backfills) do not commit per group: the stream operator swaps the whole table
    # in one commit once every group has finished (DeltaSink.replace_with_files).
    deferred = set(raw_plan.get("deferred_commit_tables", []))
    if hasattr(sink, "takeover"):  # tables this plan takes over from another pipeline
        sink.takeover |= set(raw_plan.get("takeover_tables", []))
    groups = {g.group_id: g for g in plan.groups}
    if group_id not in groups:
        raise SnapshotError(f"plan {plan_id} has no split group {group_id} (it has {len(groups)} groups)")
    group = groups[group_id]
    group_key = f"{plan_id}-g{group_id:05d}"
    attempt = uuid.uuid4().hex[:12]
    log.info("snapshot group %s: %s (attempt %s)", group_key, group.label(), attempt)

    work = _prepare(plan, group.splits, sink, group_key, attempt)
    url = mysql_jdbc.jdbc_url(settings)
    props = mysql_jdbc.jdbc_properties(settings)
    props["fetchsize"] = str(opts.fetch_size)

    try:
        conn = settings.connect()
    except Exception as exc:
        raise SnapshotError(f"snapshot group {group_id}: {exc}") from exc
    try:
        problems = check_server(conn)
        if problems:
            raise SnapshotError("the source is not ready for CDC: " + "; ".join(p.message for p in problems))
        info = source_server.server_info(conn)
        low = source_server.begin_consistent_snapshot(conn, info)
        conn.commit()  # the snapshot transaction only pins LW; the reads run in Spark's own sessions
        log.info("group %s: low watermark %s", group_key, low)
        if hooks.after_low_watermark:
            hooks.after_low_watermark()

        # The driver is idle while Spark reads: load the Arrow/Parquet machinery the stale-row rewrite
        # needs now (0.2-0.8 s on its first use in a process, measured), not after HW.
        warm = threading.Thread(target=_warm_rewrite_path, args=([w.arrow_schema for w in work],), daemon=True)
        warm.start()
        read_t0 = time.monotonic()
        # Tables of a group are read as concurrent Spark jobs: a group of several small tables
        # would otherwise leave cores idle between one-chunk jobs.
        with ThreadPoolExecutor(max_workers=max(1, len(work))) as pool:
            for fut in [pool.submit(_stage_table, spark, settings, url, props, w, plan, hooks, opts) for w in work]:
                fut.result()
        read_secs = time.monotonic() - read_t0
        staged_rows = sum(f.rows for w in work for f in w.files.values())
        log.info(
            "group %s: staged %d rows in %.1fs (%.0f rows/s)",
            group_key,
            staged_rows,
            read_secs,
            staged_rows / max(read_secs, 1e-9),
        )

        if hooks.before_high_watermark:
            hooks.before_high_watermark()
        high = low if opts.skip_backfill else source_server.current_offset(conn, info)
        log.info("group %s: high watermark %s", group_key, high)
        _check_unchanged(conn, work, plan_id)
        window_bytes = binlog_bytes(source_server.binlog_files(conn), low, high) if high > low else 0
    finally:
        conn.close()

    window_changes = 0
    warm.join()
    if high > low:
        try:
            window_changes = replay_window(
                settings, low, high, work, window_bytes=window_bytes, memory_bytes=opts.window_memory_mb << 20,
                scratch_dir=opts.scratch_dir, threads=opts.rewrite_threads,
            )
        except Exception as exc:
            raise SnapshotError(_explain_binlog_error(exc)) from exc

    rows_total = 0
    chunk_results: list[ChunkResult] = []
    secs = time.monotonic() - t0
    staged: dict[str, list[StagedFile]] = {}
    for w in work:
        files = [f for f in w.files.values() if f.rows > 0]
        if w.table in deferred:
            staged[w.table] = files
            log.info("%s: %d staged files kept for the table swap after the last group", w.table, len(files))
        else:
            sink.commit_snapshot_group(
                w.table,
                group_key,
                files,
                w.arrow_schema,
                {"plan_id": plan_id, "group_id": group_id, "low_watermark": str(low), "high_watermark": str(high)},
                primary_key=w.pk_cols,
            )
        for s in w.splits:
            f = w.files.get(s.split_id)
            rows = f.rows if f else 0
            rows_total += rows
            chunk_results.append(
                ChunkResult(w.table, s.split_id, group_id, low, high, rows, round(secs, 3))
            )
    secs = time.monotonic() - t0
    result = GroupResult(group_id, low, high, chunk_results, rows_total, secs, window_changes)
    store.write_group_report(plan_id, GroupReport(group_id, chunk_results, result.summary(), attempt, staged))
    log.info(
        "snapshot group %s done: %d chunks, %d rows, %.1fs (%.0f rows/s), LW %s, HW %s, %d window changes",
        group_key,
        len(chunk_results),
        rows_total,
        secs,
        rows_total / max(secs, 1e-9),
        low,
        high,
        window_changes,
    )
    return result


def _check_unchanged(conn: Any, work: list[_TableWork], plan_id: str) -> None:
    """Fail if a table's definition changed since the plan: the chunks were read with the plan's
    column list, so an ALTER TABLE inside the snapshot window would lose the new column's values
    (the stream starts after the window and never sees that DDL). Re-planning reads the new one."""
    for w in work:
        try:
            now = read_table_schema(conn, w.schema.table)
        except SourceSchemaError as exc:
            raise SnapshotError(f"{w.table} cannot be read any more ({exc}); re-run the DAG") from None
        if now.to_dict() != w.schema.to_dict():
            raise SnapshotError(
                f"the definition of {w.table} changed since plan {plan_id} was made (ALTER TABLE during the "
                "snapshot): trigger the DAG again, so the plan step reads the new definition and snapshots it afresh"
            )


def _prepare(
    plan: SnapshotPlan, splits: list[SnapshotChunk], sink: DeltaSink, group_key: str, attempt: str
) -> list[_TableWork]:
    out = []
    for table in dict.fromkeys(s.table for s in splits):
        schema = plan.tables[table]
        all_splits = [s for s in plan.splits if s.table == table]
        # the merge key: the primary key, or the chunk key of a table without one
        merge_key = schema.merge_key(list(all_splits[0].key_names))
        pk_key_cols = [KeyColumn(c.name, c.kind, c.collation) for c in schema.chunk_key(merge_key)]
        arrow_schema = cdc_types.arrow_schema(schema)
        w = _TableWork(
            table=table,
            schema=schema,
            arrow_schema=arrow_schema,
            splits=[s for s in splits if s.table == table],
            locator=ChunkLocator(all_splits, plan.collations),
            pk_cols=[c.name for c in pk_key_cols],
            chunk_cols=all_splits[0].key_names,
        )
        sink.prepare_table(table, arrow_schema, w.pk_cols)
        w.staging = sink.staging_location(table, group_key, attempt)
        out.append(w)
    return out


def _stage_table(
    spark: Any,
    settings: ConnectionSettings,
    url: str,
    props: dict[str, str],
    w: _TableWork,
    plan: SnapshotPlan,
    hooks: SnapshotTestHooks,
    opts: SnapshotOptions,
) -> None:
    """Read the table's chunks of this group into Parquet, one Spark task per chunk."""
    predicates = [split_condition(s, plan.collations) for s in w.splits]
    stall = hooks.stall_reads_at.get(w.table)
    if stall is not None:
        key, seconds = stall
        cols = w.splits[0].key_columns
        eq = " AND ".join(
            f"{quote_ident(c.name)} = {sql_literal(c, v, plan.collations)}" for c, v in zip(cols, key, strict=True)
        )
        predicates = [f"{p} AND IF({eq}, SLEEP({float(seconds)}), 0) = 0" for p in predicates]
    native = opts.reader != "jdbc"
    if native:
        why_not = native_reader_unavailable(settings, w.schema, w.staging)
        if why_not is not None:
            if opts.reader == "native":
                raise SnapshotError(f"{w.table}: the native reader cannot read it: {why_not}; use reader='jdbc'")
            log.info("%s: read with Spark JDBC: %s", w.table, why_not)
            native = False
    log.info("%s: reading %d chunks with the %s reader", w.table, len(predicates), "native" if native else "JDBC")
    stop = threading.Event()
    progress = threading.Thread(target=_progress_logger, args=(spark, w.table, len(predicates), stop), daemon=True)
    progress.start()
    during = None
    if hooks.during_read:
        during = threading.Thread(target=hooks.during_read, daemon=True)
        during.start()
    try:
        if native:
            w.files = _stage_natively(spark, settings, w, predicates)
        else:
            w.files = _stage_with_jdbc(spark, url, props, w, predicates)
    except Exception as exc:
        raise SnapshotError(_explain_read_error(w.table, exc)) from exc
    finally:
        stop.set()
        if during is not None:
            during.join()


def _stage_natively(
    spark: Any, settings: ConnectionSettings, w: _TableWork, predicates: list[str]
) -> dict[int, StagedFile]:
    files = {}
    for index, path, rows, size in stage_chunks(spark, settings, w.schema, predicates, w.staging):
        sid = w.splits[index].split_id
        files[sid] = StagedFile(path, rows, size, [sid])
    _remove_unlisted(w.staging, {f.path for f in files.values()})
    return files


def jdbc_frame(
    spark: Any,
    url: str,
    props: dict[str, str],
    schema: TableSchema,
    predicates: list[str] | None = None,
    key_columns: list[str] | None = None,
) -> Any:
    """The table read with Spark JDBC as a DataFrame of canonical values (:func:`projection.jdbc_read`):
    one partition per predicate, in order. ``key_columns`` are the columns the predicates compare.

    The server sends dates and times as integers and Spark's proleptic functions make them DATE
    and TIMESTAMP (a narrow projection: partition i still holds predicate i's rows)."""
    read = projection.jdbc_read(schema, key_columns or ())
    subquery = f"(SELECT {read.select_list} FROM {schema.table.quoted}) AS src"
    reader_props = {**props, "customSchema": read.custom_schema}
    if predicates is None:
        df = spark.read.jdbc(url, subquery, properties=reader_props)
    else:
        df = spark.read.jdbc(url, subquery, predicates=predicates, properties=reader_props)
    return df.selectExpr(*read.spark_exprs)


def _stage_with_jdbc(
    spark: Any, url: str, props: dict[str, str], w: _TableWork, predicates: list[str]
) -> dict[int, StagedFile]:
    df = jdbc_frame(spark, url, props, w.schema, predicates, w.chunk_cols)
    writer = df.write.mode("overwrite").option("parquet.enable.dictionary", "false")
    for name in cdc_types.dictionary_columns(w.schema):
        writer = writer.option(f"parquet.enable.dictionary#{name}", "true")
    writer.parquet(w.staging)
    return _collect_staged(w.staging, w.splits)


def _remove_unlisted(staging: str, keep: set[str]) -> None:
    """Drop files of failed task attempts (a retried chunk wrote a second file under a new name)."""
    base = _local(staging)
    for name in os.listdir(base) if os.path.isdir(base) else []:
        path = f"{base}/{name}"
        if path not in keep and name.endswith(".parquet"):
            os.remove(path)


def _warm_rewrite_path(schemas: list[pa.Schema]) -> None:
    """Round-trip an empty table of each schema through Parquet in memory (see the caller)."""
    try:
        for schema in schemas:
            buf = pa.BufferOutputStream()
            pq.write_table(schema.empty_table(), buf, use_dictionary=False)
            back = pq.read_table(pa.BufferReader(buf.getvalue())).cast(schema)
            if back.num_columns:
                back.filter(pc.invert(pc.is_in(back.column(0), value_set=back.column(0).combine_chunks())))
    except Exception as exc:  # only a warm-up: the rewrite itself reports real problems
        log.debug("warm-up of the rewrite path failed: %s", exc)


def _explain_read_error(table: str, exc: Exception) -> str:
    text = str(exc)
    # A native-reader task failure arrives as Spark's PythonException holding the worker's
    # traceback: its last "RuntimeError: reading ..." line is the message that matters.
    worker = [ln.split("RuntimeError: ", 1)[1] for ln in text.splitlines() if "RuntimeError: reading " in ln]
    if worker:
        first = worker[-1].split(" failed: ", 1)[-1][:300]
    else:
        first = next((ln for ln in text.splitlines() if "Exception:" in ln), text[:300]).strip()
        first = first.split("Exception: ", 1)[-1][:300]
    if (
        "ClassNotFoundException" in text
        or text.strip().startswith("org.mariadb.jdbc.Driver")
        or first == "org.mariadb.jdbc.Driver"
    ):
        return (
            f"reading {table} failed: the JDBC driver ({first}) is not on Spark's classpath. Pass the Connector/J jar "
            "to spark-submit with --jars (Debian: /usr/share/java/mariadb-java-client.jar), or set jdbc_jar"
        )
    if "doesn't exist" in text or "1146" in text:
        return (
            f"reading {table} failed: the table does not exist on the source any more. "
            f"Re-plan the snapshot ({first.strip()})"
        )
    if "Access denied" in text or "1142" in text or "1045" in text:
        return f"reading {table} failed: access denied. GRANT SELECT on the table to the CDC user ({first.strip()})"
    if (
        "Could not connect" in text
        or "Connection refused" in text
        or ("connect" in text.lower() and "timed out" in text.lower())
    ):
        return (
            f"reading {table} failed: cannot connect to the source server; "
            f"check host/port and that it is up ({first.strip()})"
        )
    return f"reading {table} failed: {first.strip()}"


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _collect_staged(staging: str, splits: list[SnapshotChunk]) -> dict[int, StagedFile]:
    """Map Spark's part files back to chunks: partition i read predicate i, i.e. ``splits[i]``."""
    out: dict[int, StagedFile] = {}
    base = _local(staging)
    for name in sorted(os.listdir(base)):
        m = _PART.match(name)
        if not m or not name.endswith(".parquet"):
            continue
        idx = int(m.group(1))
        if idx >= len(splits):
            raise SnapshotError(f"unexpected staged file {name}: more partitions than chunks")
        path = f"{base}/{name}"
        rows = pq.ParquetFile(path).metadata.num_rows
        sid = splits[idx].split_id
        if sid in out:  # Spark split one partition into several files (maxRecordsPerFile)
            prev = out[sid]
            merged = f"{base}/merged-{sid}-{uuid.uuid4().hex[:8]}.parquet"
            pq.write_table(pa.concat_tables([pq.read_table(prev.path), pq.read_table(path)]), merged)
            os.remove(prev.path)
            os.remove(path)
            path, rows = merged, prev.rows + rows
        out[sid] = StagedFile(path, rows, os.path.getsize(path), [sid])
    return out


def _explain_binlog_error(exc: Exception) -> str:
    text = str(exc)
    if "1227" in text or "REPLICATION SLAVE" in text.upper() or "Access denied" in text:
        return (
            "reading the binlog window failed: the CDC user lacks REPLICATION SLAVE. GRANT REPLICATION SLAVE ON *.* "
            f"TO <cdc user> ({text[:200]})"
        )
    return f"reading the binlog window failed: {text[:500]}"
