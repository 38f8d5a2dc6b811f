"""Chunk reads straight into Arrow (connectorx) inside Spark tasks, staged as Parquet by pyarrow.

Why: Spark's JDBC reader decodes MySQL's text protocol into Java objects, converts them to Spark
rows and encodes those again for Parquet; on the benchmark table that costs more CPU than the
server spends sending the rows. connectorx reads the binary protocol in native code straight
into Arrow columns, and pyarrow writes them: the same chunks staged in ~0.7x of the time on the
same 2 cores (bench/RESULTS.md). Spark still schedules the chunks (one task per chunk), so the
group keeps Spark's parallelism, retries and progress reporting; only the rows skip the JVM.

The reader is exact or not used: :func:`airflow_provider_mysqlcdc.core.types.native_select_list`
makes the server send every value in a form connectorx decodes exactly and
:func:`~airflow_provider_mysqlcdc.core.types.canonicalize_native` casts it with checked casts.
Tables with a column it cannot read (GEOMETRY) and TLS connections use Spark JDBC (see
:func:`native_reader_unavailable`). The files go wherever the sink is — a local directory or an
object store (written from the task's Python through :class:`~airflow_provider_mysqlcdc.storage.LakeStorage`).

Each chunk also gets its own watermarks here (docs/architecture.md, "The watermark bracket"): a
consistent snapshot's offset just before its SELECT and the current offset once its rows are in
memory. The task then replays that window onto the rows before writing them
(``snapshot/chunk_replay.py``), so a writer spread over the table leaves the group no staged file
to rewrite; a chunk whose window the task could not replay is left to the group's replay.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, NamedTuple
from urllib.parse import quote

from airflow_provider_mysqlcdc.core import projection
from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.core.throttle import pause_after_read
from airflow_provider_mysqlcdc.mysql import server as source_server
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.snapshot.chunk_replay import ChunkReplay
from airflow_provider_mysqlcdc.storage import LOCAL, LakeStorage, local_path


class StagedChunk(NamedTuple):
    """What one chunk read returns to the driver: its file, and the window its rows need replayed."""

    index: int
    path: str
    rows: int
    bytes: int
    low_watermark: BinlogOffset | None = None  # None: the group's bracket applies (no own watermarks)
    high_watermark: BinlogOffset | None = None
    replayed: bool = False  # the rows are as of the chunk's own HW: its window was replayed in the task
    window_changes: int = 0  # how many changes of its window that replay applied


class _Watermarks:
    """One source session per Spark task, opened at the first chunk: each chunk's LW and HW.

    LW is a consistent snapshot's offset (exact on MariaDB) taken before the chunk's SELECT starts,
    so the SELECT's read view sees every transaction before it; HW is taken once the rows are in
    memory, so every transaction the SELECT saw lies before it (docs/architecture.md)."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self.settings = settings
        self.conn: Any = None
        self.info: source_server.ServerInfo | None = None

    def _open(self) -> Any:
        if self.conn is None:
            self.conn = self.settings.connect()
            self.info = source_server.server_info(self.conn)
        return self.conn

    def low(self) -> BinlogOffset:
        conn = self._open()
        offset = source_server.begin_consistent_snapshot(conn, self.info)
        conn.commit()  # the snapshot only pins LW; the chunk is read by connectorx's own session
        return offset

    def high(self) -> BinlogOffset:
        return source_server.current_offset(self._open(), self.info)

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


def _watermarks(settings: ConnectionSettings, wanted: bool) -> contextlib.AbstractContextManager[_Watermarks | None]:
    """A task's watermark session, closed when the task's reads end (None when not ``wanted``)."""
    return contextlib.closing(_Watermarks(settings)) if wanted else contextlib.nullcontext()


def native_reader_unavailable(settings: ConnectionSettings, schema: TableSchema) -> str | None:
    """Why the native reader cannot stage this table (None if it can)."""
    try:
        import connectorx  # noqa: F401
    except ImportError:
        return "connectorx is not installed (pip install connectorx)"
    if settings.ssl is True:
        return "the connection requires TLS (the native reader is used only without TLS)"
    return projection.native_read_unsupported(schema)


def connection_uri(settings: ConnectionSettings) -> str:
    """``mysql://user:password@host:port/`` for connectorx (user and password URL-quoted)."""
    user = quote(str(settings.user), safe="")
    password = quote(str(settings.password or ""), safe="")
    timeout_ms = int(settings.connect_timeout or 10) * 1000
    return f"mysql://{user}:{password}@{settings.host}:{int(settings.port)}/?tcp_connect_timeout_ms={timeout_ms}"


def chunk_query(schema: TableSchema, predicate: str) -> str:
    return f"SELECT {projection.native_select_list(schema)} FROM {schema.table.quoted} WHERE {predicate}"


def stage_chunk(
    settings: ConnectionSettings,
    schema: TableSchema,
    index: int,
    predicate: str,
    staging_dir: str,
    dictionary_columns: list[str],
    storage: LakeStorage = LOCAL,
    slot_rate: float | None = None,
    marks: _Watermarks | None = None,
    replay: ChunkReplay | None = None,
) -> StagedChunk:
    """Read one chunk and write it as one Parquet file; runs in a Spark task (Python worker).
    With ``slot_rate`` (rows/s) the task then waits until the chunk fits that rate (``core/throttle.py``);
    with ``marks`` the chunk's own LW and HW bracket its read, and with ``replay`` too the changes
    of that window are replayed onto the rows before they are written.

    Errors come back as RuntimeError with the server's or
    the driver's message (connectorx reports a Rust panic as a BaseException; it is converted so
    Spark reports it as a task failure with that text).
    """
    import connectorx as cx

    started = time.monotonic()
    try:
        low = marks.low() if marks is not None else None
        raw = cx.read_sql(connection_uri(settings), chunk_query(schema, predicate), return_type="arrow")
        high = marks.high() if marks is not None else None
    except Exception as exc:
        raise RuntimeError(f"reading {schema.table} failed: {exc}") from None
    except BaseException as exc:  # pyo3's PanicException derives from BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise RuntimeError(f"reading {schema.table} failed: the native reader crashed: {exc}") from None
    table = projection.canonicalize_native(raw, schema)
    replayed = None
    if replay is not None and low is not None and high is not None:
        replayed = replay.replay(settings, table, index, low, high)
        if replayed is not None:
            table = replayed.rows
    path = f"{local_path(staging_dir).rstrip('/')}/part-{index:05d}-{uuid.uuid4().hex}.parquet"
    size = storage.write_parquet(table, path, use_dictionary=dictionary_columns or False)
    time.sleep(pause_after_read(table.num_rows, time.monotonic() - started, slot_rate))
    if replayed is None:
        return StagedChunk(index, path, table.num_rows, size, low, high)
    return StagedChunk(index, path, table.num_rows, size, low, high, True, replayed.changes)


def stage_chunks(
    spark: Any,
    settings: ConnectionSettings,
    schema: TableSchema,
    predicates: list[str],
    staging_dir: str,
    storage: LakeStorage = LOCAL,
    slot_rate: float | None = None,
    chunk_watermarks: bool = True,
    replay: ChunkReplay | None = None,
) -> list[StagedChunk]:
    """One Spark task per chunk; returns what :func:`stage_chunk` returned, in chunk order.
    ``replay`` (with ``chunk_watermarks``): each task replays its chunk's own window."""
    dictionary = cdc_types.dictionary_columns(schema)
    tasks = list(enumerate(predicates))
    rdd = spark.sparkContext.parallelize(tasks, len(tasks))

    def read(task: tuple[int, str]) -> StagedChunk:
        with _watermarks(settings, chunk_watermarks) as marks:
            return stage_chunk(settings, schema, task[0], task[1], staging_dir, dictionary, storage, slot_rate, marks,
                               replay if marks is not None else None)  # fmt: skip

    return sorted(rdd.map(read).collect())


def stage_small_chunks(
    spark: Any,
    settings: ConnectionSettings,
    items: list[tuple[TableSchema, str, str]],
    storage: LakeStorage = LOCAL,
    slot_rate: float | None = None,
    chunk_watermarks: bool = True,
) -> list[StagedChunk]:
    """Many small tables' chunks — ``(schema, predicate, staging dir)``, one chunk each — read by ONE
    Spark job whose tasks read several chunks each; returns :func:`stage_chunk`'s result per item,
    in order (index = the item's position).

    Why: one job (and one task) per small table costs more than reading it — a Spark job's
    scheduling and a task's start-up are tens of milliseconds, a 2,000-row chunk a few — so a
    database of hundreds of small tables was bound by Spark overhead, not by the reads."""
    if not items:
        return []
    dictionaries = [cdc_types.dictionary_columns(schema) for schema, _, _ in items]
    tasks = max(1, min(len(items), 4 * int(spark.sparkContext.defaultParallelism)))
    per_task = -(-len(items) // tasks)
    packed = [list(range(i, min(i + per_task, len(items)))) for i in range(0, len(items), per_task)]

    def read(positions: list[int]) -> list[StagedChunk]:
        with _watermarks(settings, chunk_watermarks) as marks:
            return [stage_chunk(settings, items[pos][0], pos, items[pos][1], items[pos][2], dictionaries[pos],
                                storage, slot_rate, marks) for pos in positions]  # fmt: skip

    return sorted(spark.sparkContext.parallelize(packed, len(packed)).flatMap(read).collect())

