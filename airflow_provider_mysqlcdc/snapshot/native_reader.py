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
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import quote

from airflow_provider_mysqlcdc.core import projection
from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.core.throttle import pause_after_read
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.storage import LOCAL, LakeStorage, local_path


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
) -> tuple[int, str, int, int]:
    """Read one chunk and write it as one Parquet file; runs in a Spark task (Python worker).
    With ``slot_rate`` (rows/s) the task then waits until the chunk fits that rate (``core/throttle.py``).

    Returns ``(index, path, rows, bytes)``. Errors come back as RuntimeError with the server's or
    the driver's message (connectorx reports a Rust panic as a BaseException; it is converted so
    Spark reports it as a task failure with that text).
    """
    import connectorx as cx

    started = time.monotonic()
    try:
        raw = cx.read_sql(connection_uri(settings), chunk_query(schema, predicate), return_type="arrow")
    except Exception as exc:
        raise RuntimeError(f"reading {schema.table} failed: {exc}") from None
    except BaseException as exc:  # pyo3's PanicException derives from BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise RuntimeError(f"reading {schema.table} failed: the native reader crashed: {exc}") from None
    table = projection.canonicalize_native(raw, schema)
    path = f"{local_path(staging_dir).rstrip('/')}/part-{index:05d}-{uuid.uuid4().hex}.parquet"
    size = storage.write_parquet(table, path, use_dictionary=dictionary_columns or False)
    time.sleep(pause_after_read(table.num_rows, time.monotonic() - started, slot_rate))
    return index, path, table.num_rows, size


def stage_chunks(
    spark: Any,
    settings: ConnectionSettings,
    schema: TableSchema,
    predicates: list[str],
    staging_dir: str,
    storage: LakeStorage = LOCAL,
    slot_rate: float | None = None,
) -> list[tuple[int, str, int, int]]:
    """One Spark task per chunk; returns what :func:`stage_chunk` returned, in chunk order."""
    dictionary = cdc_types.dictionary_columns(schema)
    tasks = list(enumerate(predicates))
    rdd = spark.sparkContext.parallelize(tasks, len(tasks))
    out = rdd.map(
        lambda t: stage_chunk(settings, schema, t[0], t[1], staging_dir, dictionary, storage, slot_rate)
    ).collect()
    return sorted(out)


def stage_small_chunks(
    spark: Any,
    settings: ConnectionSettings,
    items: list[tuple[TableSchema, str, str]],
    storage: LakeStorage = LOCAL,
    slot_rate: float | None = None,
) -> list[tuple[int, str, int, int]]:
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

    def read(positions: list[int]) -> list[tuple[int, str, int, int]]:
        out = []
        for pos in positions:
            schema, predicate, staging_dir = items[pos]
            _, path, rows, size = stage_chunk(settings, schema, pos, predicate, staging_dir, dictionaries[pos],
                                              storage, slot_rate)  # fmt: skip
            out.append((pos, path, rows, size))
        return out

    return sorted(spark.sparkContext.parallelize(packed, len(packed)).flatMap(read).collect())

