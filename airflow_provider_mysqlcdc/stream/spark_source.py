"""``mysql_binlog``: a PySpark Python streaming data source over the MySQL/MariaDB binlog.

Each micro-batch is a binlog range ``[start, end)`` between two transaction boundaries. The range
is cut into up to ``readers`` slices of similar byte size (``mysql/binlog_ranges.py``: on
transaction boundaries, or on rows events inside a transaction too large to leave whole), and each
is decoded by its own Spark task with its own replication ``server_id`` — one reader per batch would
cap the stream at one core. What a task does, the handoff filter included, and the output schema
are in ``stream/partition_read.py``; this module plans the batches (``docs/architecture.md``,
"Data flow" and "Binlog offsets").

Options (strings, as Spark passes them):

    source                 ConnectionSettings JSON (``ConnectionSettings.to_dict()``)
    manifest               path or fsspec URL of the stream manifest (``core/manifest.py``);
                           read once on the driver when the query starts
    max_events_per_trigger cap a micro-batch at this many binlog events (see below)
    max_bytes_per_trigger  cap a micro-batch at this many binlog bytes
    readers                parallel decoders per micro-batch; default: the application's
                           ``defaultParallelism`` (set by :func:`register`), else the driver's cores
    min_bytes_per_reader   no sub-range smaller than this (default 256 KiB: a replication
                           connection per tiny range costs more than it saves); 0 = always split
    server_id_base         the first of the ``readers`` replication server_ids the decoders use
                           (``[base, base + readers)``); default: the start of the connection's
                           ``server_id_range`` — the stream's block of it (``core/server_ids.py``)
    reconnect_timeout_seconds  how long to wait for a source server that went away (default 120)
    block_rows             changes per change block (default 8192)
    before_image           'key' (default): a before image carries the primary key and chunk key
                           columns only — all the sink and the filter need; 'full': every column
    staging                directory (path or fsspec URL every task and the driver reach) where
                           tasks stage change blocks beyond their share of max_inline_bytes; unset:
                           everything goes through Spark
    max_inline_bytes       change-block bytes per batch sent through Spark (default 32 MiB),
                           shared evenly by the batch's tasks

Offsets are ``{"file": ..., "pos": ...}`` at transaction boundaries. Where the pieces run (Spark
4.2, verified by ``tests/integration/test_stream_source.py``):

* ``initialOffset/latestOffset/partitions/commit/prepareForTriggerAvailableNow`` run in one
  long-lived Python process on the driver: it keeps one plain connection for ``SHOW MASTER
  STATUS`` / ``SHOW BINARY LOGS`` / ``SHOW BINLOG EVENTS``;
* ``read()`` runs in Python workers on a pickled copy of a reader built in a separate planning
  process; it holds no connection and builds the filter from the manifest *content* it carries
  (the manifest file may live where executors cannot read it).

Trigger semantics: ``latestOffset(start, limit)`` implements admission control (Spark 4.2):
``max_events_per_trigger`` is reported as ``ReadMaxRows`` (counted in binlog *events*, the unit
``SHOW BINLOG EVENTS`` gives cheaply, not row changes) or ``max_bytes_per_trigger`` as
``ReadMaxBytes``; when both are set the other one is applied on top of the limit Spark passes (Spark
has no composite limit). ``ReadAllAvailable`` (Trigger.Once) ignores both. The reader implements
``SupportsTriggerAvailableNow``, so ``trigger(availableNow=True)`` runs capped batches up to the
position seen at start and stops — without the mixin Spark falls back to one uncapped batch.

A source server that goes away (restart, network) is waited for, up to
``reconnect_timeout_seconds`` (default 120): the driver retries its planning queries, and a task
resumes its sub-range from the last transaction boundary it consumed, skipping the rows of the
interrupted transaction it already produced — Spark in local mode never retries a failed task.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_bytes, binlog_file_number
from airflow_provider_mysqlcdc.core.server_ids import ServerIdLayout, ServerIdSlots
from airflow_provider_mysqlcdc.mysql.binlog_ranges import (
    BinlogBoundaries,
    RangeSlice,
    capped_end,
    slice_range,
)
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.gtid_positions import gtid_set_at
from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError, binlog_files, current_offset
from airflow_provider_mysqlcdc.storage import LakeStorage
from airflow_provider_mysqlcdc.stream.partition_read import (
    BLOCK_ROWS,
    DEFAULT_RECONNECT_TIMEOUT,
    SCHEMA,
    backoff,
    is_transient,
    read_partition,
)
from airflow_provider_mysqlcdc.stream.source_options import int_option, read_manifest, secret_option
from airflow_provider_mysqlcdc.stream.staged_blocks import batch_key, write_batch_info

log = logging.getLogger(__name__)

NAME = "mysql_binlog"
#: A sub-range smaller than this is not worth its own replication connection (tunable by option).
DEFAULT_MIN_BYTES_PER_READER = 256 * 1024
#: Change-block bytes a micro-batch sends through Spark to the driver (option ``max_inline_bytes``),
#: shared evenly by its tasks; a task stages the rest of its output in the state store
#: (``stream/staged_blocks.py``). Spark holds a collected batch several times over in the driver
#: JVM, and an ordinary batch (capped at 32 MiB of binlog) stays near this size, so mainly
#: batches of huge transactions stage.
DEFAULT_MAX_INLINE_BYTES = 32 * 1024 * 1024
#: A batch with at least this many binlog bytes is "large": its plan is recorded for progress reports.
LARGE_BATCH_BYTES = 64 * 1024 * 1024
T = TypeVar("T")


class BinlogPartition(InputPartition):
    """One task's share of a micro-batch (a :class:`~airflow_provider_mysqlcdc.mysql.binlog_ranges.RangeSlice`),
    the batch it belongs to (for staged output) and the server_id its reader uses."""

    def __init__(
        self,
        index: int,
        start: dict[str, Any],
        end: dict[str, Any],
        server_id: int,
        emit_from: dict[str, Any] | None = None,
        emit_to: dict[str, Any] | None = None,
        batch: str | None = None,
        inline_bytes: int | None = None,
    ):
        super().__init__((index, start, end, server_id, emit_from, emit_to, batch, inline_bytes))
        self.index = index
        self.start = start
        self.end = end
        self.server_id = server_id
        self.emit_from = emit_from
        self.emit_to = emit_to
        self.batch = batch or batch_key(BinlogOffset.from_dict(start), BinlogOffset.from_dict(end))
        self.inline_bytes = inline_bytes  # this task's share of max_inline_bytes; None = no limit

    def __repr__(self) -> str:
        inside = f", rows events {self.emit_from} -> {self.emit_to}" if self.emit_from or self.emit_to else ""
        return f"BinlogPartition({self.index}, {self.start} -> {self.end}{inside}, server_id={self.server_id})"


class MySqlBinlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans binlog micro-batches on the driver and decodes their sub-ranges in the tasks."""

    def __init__(self, schema: StructType, options: Any, default_readers: int | None = None):
        self.schema = schema
        src = secret_option(options, "source", "source_env")
        if not src:
            raise ValueError(
                f"the {NAME} source needs option 'source' (ConnectionSettings JSON) or 'source_env' (the environment "
                "variable holding it)"
            )
        self.source = json.loads(src) if isinstance(src, str) else dict(src)
        # Credentials of the object store holding the manifest and the staging directory; they
        # travel to the tasks inside the pickled reader, never in a Spark conf.
        self.storage = LakeStorage.from_json(secret_option(options, "storage", "storage_env"))
        path = options.get("manifest")
        if not path:
            raise ValueError(f"the {NAME} source needs option 'manifest' (path of the stream manifest JSON)")
        self.manifest_path = str(path)
        # Read once, on the driver: the content travels to the tasks with the pickled reader.
        self.manifest = read_manifest(self.manifest_path, self.storage)
        self.tables = sorted(self.manifest.tables)
        self.max_events = int_option(options, "max_events_per_trigger", None, 1)
        self.max_bytes = int_option(options, "max_bytes_per_trigger", None, 1)
        fallback = default_readers or os.cpu_count() or 1
        self.readers = int_option(options, "readers", max(1, int(fallback)), 1) or 1
        self.min_bytes_per_reader = int_option(options, "min_bytes_per_reader", DEFAULT_MIN_BYTES_PER_READER, 0) or 0
        # Decoder slot i uses the i-th id of the stream's block: the first ``readers`` ids of the
        # connection's server_id_range (or from server_id_base), never used by snapshot groups.
        base = int_option(options, "server_id_base", None, 1)
        if base:
            self.server_ids = ServerIdSlots(base, self.readers)
        else:
            layout = ServerIdLayout(ConnectionSettings.from_dict(self.source).server_id_range, self.readers)
            layout.check(1)  # the stream's block plus at least one snapshot group's id
            self.server_ids = ServerIdSlots(layout.lo, self.readers)
        self.reconnect_timeout = int_option(options, "reconnect_timeout_seconds", DEFAULT_RECONNECT_TIMEOUT, 0) or 0
        self.block_rows = int_option(options, "block_rows", BLOCK_ROWS, 1) or BLOCK_ROWS
        self.before_image = str(options.get("before_image") or "key").strip().lower()
        if self.before_image not in ("key", "full"):
            raise ValueError(f"option before_image={self.before_image!r} of the {NAME} source must be 'key' or 'full'")
        self.staging = str(options.get("staging") or "").strip() or None
        self.max_inline_bytes = int_option(options, "max_inline_bytes", DEFAULT_MAX_INLINE_BYTES, 0) or 0
        # Driver-only state, created on first use and never pickled.
        self._conn: Any = None
        self._target: BinlogOffset | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    # ---------------------------------------------------------------- driver side
    def _settings(self) -> ConnectionSettings:
        return ConnectionSettings.from_dict(self.source)

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self._settings().connect()
        else:
            self._conn.ping(reconnect=True)
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection
                pass

    def _retrying(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)``; while the server is away (restart, network), reconnect and retry
        for up to ``reconnect_timeout_seconds`` instead of failing the query."""
        deadline: float | None = None
        attempt = 0
        while True:
            try:
                return fn(self._connection())
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self._drop_connection()
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.reconnect_timeout
                if now >= deadline:
                    raise
                log.warning("%s: %s failed (%s); retrying", NAME, what, exc)
                time.sleep(backoff(attempt))
                attempt += 1

    def _files_checked(self, conn: Any, start: BinlogOffset) -> list[tuple[str, int]]:
        """SHOW BINARY LOGS, raising the actionable purge error if ``start``'s file is gone."""
        files = binlog_files(conn)
        if start.file_number not in {binlog_file_number(f) for f, _ in files}:
            oldest = files[0][0] if files else "none"
            raise BinlogUnavailableError(
                f"binlog file {start.file} (the stream's offset {start}) has been purged from the source "
                f"(oldest kept: {oldest}). The changes after that point are lost to CDC: re-snapshot the "
                "captured tables (trigger the DAG with resnapshot_tables, or startup_mode=initial) and start "
                "the stream with a new checkpoint; raise the server's binlog retention "
                "(binlog_expire_logs_seconds / expire_logs_days) so the stream's offset stays available"
            )
        return files

    def _head(self, conn: Any, start: BinlogOffset) -> BinlogOffset:
        head = current_offset(conn)
        if start.server and head.server != start.server:
            raise BinlogUnavailableError(
                f"the connection now reaches server {head.server}, but the stream's offset {start} names the binlog "
                f"of server {start.server} (a failover, or the address moved): a file:pos of one server means "
                "nothing on another. Restart the stream (trigger the DAG, or run the stream job again): it "
                "resumes on the new server by the offset's GTID set"
            )
        if head < start:
            raise BinlogUnavailableError(
                f"the source's binlog is at {head}, before the stream's offset {start}: the binlog was reset "
                "(RESET MASTER) or the connection points at another server. Re-snapshot the captured tables "
                "and start the stream with a new checkpoint"
            )
        return head

    def initialOffset(self) -> dict[str, Any]:
        return self.manifest.start_offset.to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_events:
            return ReadMaxRows(self.max_events)
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._retrying("reading the binlog position", current_offset)
        log.info("%s: availableNow target %s", NAME, self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = BinlogOffset.from_dict(start)
        max_events, max_bytes = None, None
        if isinstance(limit, ReadMaxRows):
            max_events, max_bytes = int(limit.max_rows), self.max_bytes
        elif isinstance(limit, ReadMaxBytes):
            max_events, max_bytes = self.max_events, int(limit.max_bytes)
        elif not isinstance(limit, ReadAllAvailable):
            max_events, max_bytes = self.max_events, self.max_bytes

        def latest(conn: Any) -> BinlogOffset:
            files = self._files_checked(conn, begin)
            head = self._head(conn, begin)
            if self._target is not None and self._target < head:
                head = self._target
            if head <= begin or not (max_events or max_bytes):
                return head
            end = capped_end(BinlogBoundaries(conn), files, begin, head, max_events, max_bytes)
            if end == head:
                return head
            # the GTID set behind a batch's end is what lets a failover find it on another server
            return end.on(head.server, gtid_set_at(conn, begin, end))

        end = self._retrying("planning the next batch", latest)
        if end <= begin:  # nothing new (never move backwards)
            return start
        return end.to_dict()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        try:
            head = current_offset(self._connection())
        except Exception:  # status reporting must never fail the query
            return None
        return head.position().to_dict()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[BinlogPartition]:
        begin, stop = BinlogOffset.from_dict(start), BinlogOffset.from_dict(end)
        if stop <= begin:
            return []

        def cut(conn: Any) -> tuple[list[RangeSlice], int]:
            files = self._files_checked(conn, begin)
            size = binlog_bytes(files, begin, stop)
            if self.readers <= 1:
                return [RangeSlice(begin, stop)], size
            bounds = BinlogBoundaries(conn)
            return slice_range(bounds, files, begin, stop, self.readers, self.min_bytes_per_reader), size

        slices, size = self._retrying("splitting the batch", cut)
        batch = batch_key(begin, stop)
        if self.staging and size >= LARGE_BATCH_BYTES:
            log.info("%s: large batch %s -> %s: %.1f MiB of binlog in %d slices", NAME, begin, stop, size / 2**20,
                     len(slices))  # fmt: skip
            try:
                write_batch_info(self.staging, batch, {"start": start, "end": end, "binlog_bytes": size,
                                                       "slices": len(slices), "planned_at": time.time()},
                                 self.storage)  # fmt: skip
            except OSError as exc:  # informative only
                log.debug("could not record the batch plan: %s", exc)
        share = self.max_inline_bytes // len(slices)
        # Spark plans a micro-batch only once the previous one's tasks have all finished, so every
        # slot is free again here; a batch has at most ``readers`` slices, one slot each.
        self.server_ids.release_all()
        return [
            BinlogPartition(
                i, sl.start.to_dict(), sl.end.to_dict(), self.server_ids.acquire(batch),
                sl.emit_from.to_dict() if sl.emit_from else None, sl.emit_to.to_dict() if sl.emit_to else None, batch,
                share,
            )
            for i, sl in enumerate(slices)
        ]  # fmt: skip

    def commit(self, end: dict[str, Any]) -> None:
        """The binlog is read, never consumed: only the batch's server_id slots are released."""
        self.server_ids.release_all()
        log.debug("%s: committed %s", NAME, end)

    def stop(self) -> None:
        self._drop_connection()

    # ---------------------------------------------------------------- task side
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, BinlogPartition)
        return read_partition(self, partition)


class MySqlBinlogDataSource(DataSource):
    """``spark.readStream.format("mysql_binlog")``: options in the module docstring, the output
    schema in ``stream/partition_read.py``."""

    #: Set by :func:`register` from ``spark.sparkContext.defaultParallelism``; the planning process
    #: has no SparkContext to ask.
    default_readers: int | None = None

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MySqlBinlogStreamReader(schema, self.options, self.default_readers)


def _check_worker_python(python: str) -> None:
    """The Python Spark starts for the planning and read processes must import this package."""
    probe = "import pyarrow, pymysql, pymysqlreplication, airflow_provider_mysqlcdc.core.change_block"
    try:
        res = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(
            f"Spark's Python ({python}) cannot be started ({exc}): set PYSPARK_PYTHON to the Python that has "
            "airflow-provider-mysqlcdc installed"
        ) from exc
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(
            f"Spark's Python workers ({python}) cannot import the {NAME} source ({last}). Set PYSPARK_PYTHON "
            "(or spark.pyspark.python) to the Python that has airflow-provider-mysqlcdc, pyarrow and "
            "mysql-replication installed, before the SparkContext starts"
        )


def register(spark: Any, default_readers: int | None = None, check_python: bool = True) -> None:
    """Register the ``mysql_binlog`` source with ``spark``.

    The registered class carries ``default_readers`` (default: ``defaultParallelism``, the cores of
    the application), used when a query sets no ``readers`` option. It is a subclass made here and
    pickled by value, because the planning process cannot ask the SparkContext. ``check_python``
    starts Spark's Python once to make sure it can import this package: otherwise the first batch
    fails with a bare ``ModuleNotFoundError`` deep in a Python worker traceback.
    """
    sc = spark.sparkContext
    if check_python:
        _check_worker_python(getattr(sc, "pythonExec", None) or "python3")
    readers = default_readers
    if readers is None:
        try:
            readers = int(sc.defaultParallelism)
        except Exception:  # not a classic session
            readers = None
    cls = type(
        "MySqlBinlogDataSourceRegistered",
        (MySqlBinlogDataSource,),
        {"default_readers": max(1, readers) if readers else None, "__module__": __name__},
    )
    spark.dataSource.register(cls)
