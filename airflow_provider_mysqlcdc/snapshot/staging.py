"""Stage a group's chunks: read every chunk once and write it as Parquet inside its Delta table.

The second step of the watermark bracket (``snapshot/group.py``; docs/architecture.md, "The
watermark bracket"): every row the group holds is materialised here before the high watermark is
taken and never read from the source again. One Spark task reads one chunk, with the native
connectorx reader where it reads the table exactly (``snapshot/native_reader.py``), else with Spark
JDBC. The staged files sit in the table's directory, invisible until the group commits them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator, SnapshotChunk, fill_gaps
from airflow_provider_mysqlcdc.core.keys import Collation, KeyColumn
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.predicate import quote_ident, split_condition, sql_literal
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.row_metadata import lake_schema
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.core.throttle import read_slot_rate
from airflow_provider_mysqlcdc.mysql import jdbc as mysql_jdbc
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.planner import SnapshotPlan
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.chunk_replay import ChunkReplay
from airflow_provider_mysqlcdc.snapshot.jdbc_staging import jdbc_frame, remove_unlisted, stage_with_jdbc
from airflow_provider_mysqlcdc.snapshot.native_reader import (
    StagedChunk,
    native_reader_unavailable,
    stage_chunks,
    stage_small_chunks,
)
from airflow_provider_mysqlcdc.storage import LOCAL, LakeStorage

log = logging.getLogger(__name__)
TABLE_THREADS = 8  # a group's per-table Delta work (create, commit) done this many tables at a time


class SnapshotError(RuntimeError):
    """The snapshot of a group failed; the message says why and what to do. Nothing was committed."""


def _nothing() -> None:
    pass


@dataclass
class SnapshotTestHooks:
    """Deterministic interleavings for tests: callables run at each point of the algorithm.

    ``stall_reads_at`` makes the SELECT of a table pause (server-side ``SLEEP``) when it reaches a
    key, so ``during_read`` runs while that SELECT is in flight. The defaults do nothing, so the
    algorithm calls them unconditionally. Not for production use.
    """

    after_low_watermark: Callable[[], None] = _nothing
    during_read: Callable[[], None] = _nothing
    before_high_watermark: Callable[[], None] = _nothing
    stall_reads_at: dict[str, tuple[tuple[Any, ...], float]] = field(default_factory=dict)


@dataclass
class TableWork:
    """One table of a group on its way through the bracket: its chunks, schema and staged files."""

    table: str
    schema: TableSchema
    arrow_schema: pa.Schema
    splits: list[SnapshotChunk]  # this group's chunks of the table
    locator: ChunkLocator  # over ALL chunks of the table (keys may move to other groups' chunks)
    pk_cols: list[str]
    chunk_cols: list[str]
    staging: str = ""
    files: dict[int, StagedFile] = field(default_factory=dict)  # split_id -> staged file
    storage: LakeStorage = LOCAL  # how to reach ``staging`` (the sink's object store)
    row_filter: str | None = None  # snapshot_filters: read only the rows this SQL condition selects
    metadata_columns: bool = False  # the lake rows carry _op, _commit_ts, _binlog_file, _binlog_pos
    # split_id -> the chunk's own (LW, HW) where its reader took them (native reader); the other
    # chunks take the group's bracket (docs/architecture.md, "The watermark bracket")
    windows: dict[int, tuple[BinlogOffset, BinlogOffset]] = field(default_factory=dict)
    # Whether a native-reader task replays its chunk's own window before writing it
    # (``snapshot/chunk_replay.py``); split id -> changes replayed, of the chunks whose task did: the
    # group's replay skips them.
    replay_in_task: bool = False
    replayed: dict[int, int] = field(default_factory=dict)

    @property
    def lake_schema(self) -> pa.Schema:
        """The Delta table's schema: the staged rows' plus the metadata columns when on."""
        return lake_schema(self.arrow_schema, self.metadata_columns)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files.values())


def table_work(
    plan: SnapshotPlan,
    chunks: list[SnapshotChunk],
    sink: DeltaSink,
    group_key: str,
    attempt: str,
    row_filters: dict[str, str] | None = None,
    metadata_columns: bool = False,
) -> list[TableWork]:
    """The group's tables, each given its own staging location (no I/O: :func:`creating_tables`
    makes their Delta tables).

    The staging location is per attempt, so a retried group never adopts a failed attempt's files.
    ``row_filters`` (table -> SQL condition) narrow a partial backfill's reads."""
    out = []
    by_table: dict[str, list[SnapshotChunk]] = {}
    for s in plan.splits:
        by_table.setdefault(s.table, []).append(s)
    for table in dict.fromkeys(s.table for s in chunks):
        schema = plan.tables[table]
        all_splits = by_table[table]
        # the merge key: the primary key, or the chunk key of a table without one
        merge_key = schema.merge_key(list(all_splits[0].key_names))
        pk_key_cols = [KeyColumn(c.name, c.kind, c.collation) for c in schema.chunk_key(merge_key)]
        arrow_schema = cdc_types.arrow_schema(schema)
        w = TableWork(
            table=table,
            schema=schema,
            arrow_schema=arrow_schema,
            splits=[s for s in chunks if s.table == table],
            locator=ChunkLocator(fill_gaps(all_splits), plan.collations),  # a repair plans some chunks only
            pk_cols=[c.name for c in pk_key_cols],
            chunk_cols=all_splits[0].key_names,
            storage=sink.storage,
            row_filter=(row_filters or {}).get(table),
            metadata_columns=metadata_columns,
        )
        w.staging = sink.staging_location(table, group_key, attempt)
        out.append(w)
    return out


@contextlib.contextmanager
def creating_tables(sink: DeltaSink, work: list[TableWork]) -> Iterator[None]:
    """One Delta table per table of ``work``, created (and claimed) side by side if new, checked if
    not, while the block runs (delta-rs releases the GIL meanwhile). At the block's end, raises the
    first failure (another pipeline's table)."""
    with ThreadPoolExecutor(max_workers=min(TABLE_THREADS, max(1, len(work)))) as pool:
        made = [pool.submit(sink.prepare_table, w.table, w.lake_schema, w.pk_cols) for w in work]
        yield
        for f in made:
            f.result()


def stage_group(
    spark: Any,
    settings: ConnectionSettings,
    work: list[TableWork],
    collations: dict[str, Collation],
    *,
    reader: str,
    fetch_size: int,
    hooks: SnapshotTestHooks,
    max_rows_per_second: float | None = None,
    chunk_watermarks: bool = True,
) -> int:
    """Stage every chunk of ``work`` (``w.files`` of each table is set); returns the rows staged.

    The tables are read as concurrent Spark jobs: a group of several small tables would otherwise
    leave cores idle between one-chunk jobs. The driver is idle meanwhile, so it loads the Arrow
    and Parquet machinery the window replay needs now rather than after the high watermark.
    ``max_rows_per_second`` is this group's share of the snapshot's throttle (``core/throttle.py``).
    With ``chunk_watermarks`` the native reader brackets each chunk with its own LW and HW (``w.windows``).
    """
    url = mysql_jdbc.jdbc_url(settings)
    props = {**mysql_jdbc.jdbc_properties(settings), "fetchsize": str(fetch_size)}
    slot_rate = None
    if max_rows_per_second:
        slots = min(sum(len(w.splits) for w in work), int(spark.sparkContext.defaultParallelism))
        slot_rate = read_slot_rate(max_rows_per_second, 1, slots)
        log.info("throttled to %.0f rows/s: each of %d concurrent chunk reads paces itself to %.0f rows/s",
                 max_rows_per_second, slots, slot_rate)  # fmt: skip
    small = _small_tables(settings, work, reader, hooks)
    with _in_background(_warm_rewrite_path, [w.arrow_schema for w in work]):
        with ThreadPoolExecutor(max_workers=max(1, len(work) - len(small) + 1)) as pool:
            stage_one = functools.partial(_stage_table, spark, settings, url, props, collations=collations,
                                          reader=reader, hooks=hooks, slot_rate=slot_rate,
                                          chunk_watermarks=chunk_watermarks)  # fmt: skip
            futures = [pool.submit(stage_one, w) for w in work if w not in small]
            if small:
                futures.append(pool.submit(_stage_small_tables, spark, settings, small, collations, hooks, slot_rate,
                                           chunk_watermarks))  # fmt: skip
            for fut in futures:
                fut.result()
    return sum(w.rows for w in work)


def _small_tables(settings: ConnectionSettings, work: list[TableWork], reader: str,
                  hooks: SnapshotTestHooks) -> list[TableWork]:  # fmt: skip
    """The group's one-chunk tables the native reader can read: staged together by one Spark job."""
    if reader == "jdbc":
        return []
    small = [w for w in work if len(w.splits) == 1 and w.table not in hooks.stall_reads_at
             and native_reader_unavailable(settings, w.schema) is None]  # fmt: skip
    return small if len(small) > 1 else []


def _stage_small_tables(
    spark: Any,
    settings: ConnectionSettings,
    small: list[TableWork],
    collations: dict[str, Collation],
    hooks: SnapshotTestHooks,
    slot_rate: float | None,
    chunk_watermarks: bool,
) -> None:
    """Stage one-chunk tables in one Spark job (``native_reader.stage_small_chunks``)."""
    items = []
    for w in small:
        predicate = split_condition(w.splits[0], collations)
        items.append((w.schema, f"{predicate} AND ({w.row_filter})" if w.row_filter else predicate, w.staging))
    log.info("reading %d one-chunk tables in one Spark job with the native reader", len(small))
    try:
        with _in_background(hooks.during_read):
            staged = stage_small_chunks(spark, settings, items, small[0].storage, slot_rate, chunk_watermarks)
    except Exception as exc:
        raise SnapshotError(_explain_read_error(", ".join(w.table for w in small), exc)) from exc
    for w, chunk in zip(small, staged, strict=True):
        w.files, w.windows, _ = _adopt([(w.splits[0].split_id, chunk)])
        remove_unlisted(w.staging, {chunk.path}, w.storage)


@contextlib.contextmanager
def _in_background(target: Callable[..., None], *args: Any) -> Iterator[None]:
    """Run ``target(*args)`` in a daemon thread for the duration of the block; wait for it at the end."""
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _stage_table(
    spark: Any,
    settings: ConnectionSettings,
    url: str,
    props: dict[str, str],
    w: TableWork,
    collations: dict[str, Collation],
    reader: str,
    hooks: SnapshotTestHooks,
    slot_rate: float | None = None,
    chunk_watermarks: bool = True,
) -> None:
    """Read the table's chunks of this group into Parquet, one Spark task per chunk."""
    predicates = _stalled([split_condition(s, collations) for s in w.splits], w, collations, hooks)
    if w.row_filter:
        log.info("%s: reading only the rows where %s (snapshot_filters)", w.table, w.row_filter)
    native = reader != "jdbc"
    if native:
        why_not = native_reader_unavailable(settings, w.schema)
        if why_not is not None:
            if reader == "native":
                raise SnapshotError(f"{w.table}: the native reader cannot read it: {why_not}; use reader='jdbc'")
            log.info("%s: read with Spark JDBC: %s", w.table, why_not)
            native = False
    log.info("%s: reading %d chunks with the %s reader", w.table, len(predicates), "native" if native else "JDBC")
    stop = threading.Event()
    progress = threading.Thread(target=_progress_logger, args=(spark, w.table, len(predicates), stop), daemon=True)
    progress.start()
    try:
        with _in_background(hooks.during_read):
            if native:
                filtered = [f"{p} AND ({w.row_filter})" for p in predicates] if w.row_filter else predicates
                _stage_natively(spark, settings, w, filtered, slot_rate, chunk_watermarks)
            else:
                w.files = stage_with_jdbc(spark, url, props, w, predicates, slot_rate)
    except Exception as exc:
        raise SnapshotError(_explain_read_error(w.table, exc)) from exc
    finally:
        stop.set()


def _stalled(
    predicates: list[str], w: TableWork, collations: dict[str, Collation], hooks: SnapshotTestHooks
) -> list[str]:
    """The predicates, made to pause at the key a test asked for (``hooks.stall_reads_at``)."""
    stall = hooks.stall_reads_at.get(w.table)
    if stall is None:
        return predicates
    key, seconds = stall
    cols = w.splits[0].key_columns
    eq = " AND ".join(
        f"{quote_ident(c.name)} = {sql_literal(c, v, collations)}" for c, v in zip(cols, key, strict=True)
    )
    return [f"{p} AND IF({eq}, SLEEP({float(seconds)}), 0) = 0" for p in predicates]


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


def _stage_natively(
    spark: Any,
    settings: ConnectionSettings,
    w: TableWork,
    predicates: list[str],
    slot_rate: float | None,
    chunk_watermarks: bool,
) -> None:
    replay = None
    if w.replay_in_task and chunk_watermarks:
        replay = ChunkReplay(w.schema, w.arrow_schema, w.locator, tuple(s.split_id for s in w.splits),
                             tuple(w.pk_cols), tuple(w.chunk_cols))  # fmt: skip
    staged = stage_chunks(spark, settings, w.schema, predicates, w.staging, w.storage, slot_rate, chunk_watermarks,
                          replay)  # fmt: skip
    w.files, w.windows, w.replayed = _adopt([(w.splits[c.index].split_id, c) for c in staged])
    remove_unlisted(w.staging, {f.path for f in w.files.values()}, w.storage)
    if replay is not None:
        rest = len(staged) - len(w.replayed)
        log.info("%s: %d of %d chunks replayed their own window in their task (%d changes)%s", w.table,
                 len(w.replayed), len(staged), sum(w.replayed.values()),
                 f"; the group's replay takes the other {rest}" if rest else "")  # fmt: skip


def _adopt(
    staged: list[tuple[int, StagedChunk]],
) -> tuple[dict[int, StagedFile], dict[int, tuple[BinlogOffset, BinlogOffset]], dict[int, int]]:
    """The staged file of each chunk (by split id), the chunks' own windows where they have one, and
    the changes replayed by the chunks whose task replayed that window."""
    files, windows, replayed = {}, {}, {}
    for sid, chunk in staged:
        files[sid] = StagedFile(chunk.path, chunk.rows, chunk.bytes, [sid])
        if chunk.low_watermark is not None and chunk.high_watermark is not None:
            windows[sid] = (chunk.low_watermark, chunk.high_watermark)
            if chunk.replayed:
                replayed[sid] = chunk.window_changes
    return files, windows, replayed


def _warm_rewrite_path(schemas: list[pa.Schema]) -> None:
    """Round-trip an empty table of each schema through Parquet in memory: the first use of that
    machinery in a process is slow, and the driver is idle while Spark reads (see :func:`stage_group`)."""
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


__all__ = [
    "SnapshotError",
    "SnapshotTestHooks",
    "TableWork",
    "creating_tables",
    "jdbc_frame",
    "stage_group",
    "table_work",
]
