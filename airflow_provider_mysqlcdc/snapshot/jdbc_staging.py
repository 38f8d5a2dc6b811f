"""Stage chunks with Spark JDBC: the reader for tables the native reader cannot read exactly.

Split from ``snapshot/staging.py`` (the group's staging step, which picks the reader): one Spark
partition per chunk predicate; Spark writes the Parquet files itself on local storage, or the
Python workers write them (object storage — pyspark ships no hadoop-aws — or a throttled read).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_mysqlcdc.core import projection
from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.core.throttle import pause_after_read
from airflow_provider_mysqlcdc.storage import LOCAL, LakeStorage, is_local

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.snapshot.staging import TableWork

_PART = re.compile(r"part-(\d+)-")


def jdbc_frame(
    spark: Any,
    url: str,
    props: dict[str, str],
    schema: TableSchema,
    predicates: list[str] | None = None,
    key_columns: list[str] | None = None,
    row_filter: str | None = None,
) -> Any:
    """The table read with Spark JDBC as a DataFrame of canonical values (:func:`projection.jdbc_read`):
    one partition per predicate, in order. ``key_columns`` are the columns the predicates compare.
    ``row_filter`` is a condition on the table's own columns (inside the subquery, where the
    columns still have their source types).

    The server sends dates and times as integers and Spark's proleptic functions make them DATE
    and TIMESTAMP (a narrow projection: partition i still holds predicate i's rows)."""
    read = projection.jdbc_read(schema, key_columns or ())
    where = f" WHERE ({row_filter})" if row_filter else ""
    subquery = f"(SELECT {read.select_list} FROM {schema.table.quoted}{where}) AS src"
    reader_props = {**props, "customSchema": read.custom_schema}
    if predicates is None:
        df = spark.read.jdbc(url, subquery, properties=reader_props)
    else:
        df = spark.read.jdbc(url, subquery, predicates=predicates, properties=reader_props)
    return df.selectExpr(*read.spark_exprs)


def stage_with_jdbc(
    spark: Any, url: str, props: dict[str, str], w: TableWork, predicates: list[str], slot_rate: float | None
) -> dict[int, StagedFile]:
    df = jdbc_frame(spark, url, props, w.schema, predicates, w.chunk_cols, w.row_filter)
    # Spark's JVM has no object-store connector, and a throttled read paces in the task: Python writes the files
    if not is_local(w.staging) or slot_rate:
        return _stage_partitions_from_python(df, w, predicates, slot_rate)
    writer = df.write.mode("overwrite").option("parquet.enable.dictionary", "false")
    for name in cdc_types.dictionary_columns(w.schema):
        writer = writer.option(f"parquet.enable.dictionary#{name}", "true")
    writer.parquet(w.staging)
    return _collect_staged(w.staging, w.splits)


def _stage_partitions_from_python(
    df: Any, w: TableWork, predicates: list[str], slot_rate: float | None = None
) -> dict[int, StagedFile]:
    """Write each JDBC partition (= chunk) as one Parquet file from the Python worker (``mapInArrow``);
    with ``slot_rate`` the task then waits until its rows fit that rate (``core/throttle.py``)."""
    staging, storage, target = w.staging.rstrip("/"), w.storage, w.arrow_schema
    dictionary = cdc_types.dictionary_columns(w.schema) or False

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        started = time.monotonic()
        index = TaskContext.get().partitionId()
        parts = [b for b in batches if b.num_rows]
        table = pa.Table.from_batches(parts).select(target.names).cast(target) if parts else None
        if table is not None and table.num_rows:
            path = f"{staging}/part-{index:05d}-{uuid.uuid4().hex}.parquet"
            size = storage.write_parquet(table, path, use_dictionary=dictionary)
            time.sleep(pause_after_read(table.num_rows, time.monotonic() - started, slot_rate))
            yield pa.record_batch([[index], [path], [table.num_rows], [size]], names=["index", "path", "rows", "size"])

    rows = df.mapInArrow(write, "index long, path string, rows long, size long").collect()
    files = {}
    for r in rows:
        sid = w.splits[r["index"]].split_id
        files[sid] = StagedFile(r["path"], int(r["rows"]), int(r["size"]), [sid])
    remove_unlisted(staging, {f.path for f in files.values()}, storage)
    return files


def remove_unlisted(staging: str, keep: set[str], storage: LakeStorage = LOCAL) -> None:
    """Drop files of failed task attempts (a retried chunk wrote a second file under a new name)."""
    base = _local(staging).rstrip("/")
    for name in storage.listdir(base):
        path = f"{base}/{name}"
        if path not in keep and name.endswith(".parquet"):
            storage.remove(path)


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _collect_staged(staging: str, splits: list[SnapshotChunk]) -> dict[int, StagedFile]:
    """Map Spark's part files back to chunks: partition i read predicate i, i.e. ``splits[i]``."""
    from airflow_provider_mysqlcdc.snapshot.staging import SnapshotError  # no cycle at import time

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


__all__ = ["jdbc_frame", "remove_unlisted", "stage_with_jdbc"]
