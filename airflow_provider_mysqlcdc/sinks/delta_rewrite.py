"""Apply a folded batch of any size to a Delta table in bounded memory, as ONE commit.

Why not delta-rs' MERGE: it takes its source as one in-memory table (a batch of a million updated
rows is gigabytes) and commits on every call, so a batch split into pieces would show readers half a
transaction. Here the batch arrives as the buckets of
:class:`~airflow_provider_mysqlcdc.spill.bucketed_fold.BucketedFold` and is applied as a
copy-on-write rewrite that is the same as the MERGE of :meth:`DeltaSink.apply_changes` (matched
keys deleted or replaced, new keys inserted):

1. each bucket's upserts are written as new data files of the table (sorted by key, with key
   statistics), and its changed keys — every upsert's and delete's key — are kept, in memory or
   spilled to scratch files when they exceed the budget;
2. the table's data files are matched against the changed keys pass by pass (one pass per group
   of buckets that fits the budget; files whose key statistics lie outside a pass's range are not
   read), giving a drop mask per file;
3. every file with a dropped row is rewritten without those rows, streamed row group by row group;
4. one Delta commit removes the rewritten files and adds the new ones, carrying the transaction
   identifier ``(app_id, version)``: readers see the whole batch or none of it, and a replay after
   a crash is recognised and skipped, exactly as for a MERGE.

Files written by an attempt that did not commit are invisible to readers; the next attempt of the
same batch deletes them (local tables) and VACUUM removes them anywhere.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS, RoutedTable
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_files import remove_action
from airflow_provider_mysqlcdc.sinks.delta_merge import COMMIT_ATTEMPTS, already_applied, conform_upserts
from airflow_provider_mysqlcdc.sinks.delta_routing import file_schema
from airflow_provider_mysqlcdc.sinks.delta_stats import declared_stats_columns, file_stats, merge_range
from airflow_provider_mysqlcdc.spill.bucketed_fold import FoldedBucket
from airflow_provider_mysqlcdc.spill.changed_keys import ChangedKeys, match_files
from airflow_provider_mysqlcdc.storage import LakeStorage, is_local

log = logging.getLogger(__name__)

STREAM_DIR = "stream"
#: Rows per data file written for upserts and rewrites (delta-rs' own default target is ~100 MB).
FILE_ROWS = 1_000_000
READ_BATCH_ROWS = 65_536

Progress = Callable[[str, dict[str, Any]], None]
#: Local directories this process has made (a small table's every batch writes into the same one).
_MADE_DIRS: set[str] = set()


@dataclass
class RewriteResult:
    """What one bounded apply did (for the batch's log line and status)."""

    applied: bool
    upserts: int = 0
    deletes: int = 0
    files_removed: int = 0
    files_added: int = 0
    rows_copied: int = 0
    key_passes: int = 0
    version: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _NewFile:
    rel: str
    rows: int
    size: int
    ranges: dict[str, tuple[Any, Any, int]]


def _added(files: list[_NewFile], route: RoutedTable | None, now: int, dt: DeltaTable) -> list[AddAction]:
    """Add actions of data files this module wrote (a routed shard's carry its partition values),
    with statistics for the columns ``dt`` (the table committed to) declares."""
    columns = declared_stats_columns(dt.metadata().configuration)
    return [AddAction(path=f.rel, size=f.size, partition_values=route.partition_values if route else {},
                      modification_time=now, data_change=True, stats=file_stats(f.rows, f.ranges, columns))
            for f in files]  # fmt: skip


class _TableFiles:
    """Data files of one Delta table by their relative paths, on a local disk or an object store."""

    @classmethod
    def of(cls, sink: DeltaSink, table: str, route: RoutedTable | None) -> _TableFiles:
        """``table``'s files, written under the stream's directory (a routed shard's own, if routed)."""
        return cls(sink.table_uri(table), sink.storage, f"{STREAM_DIR}/{route.source}" if route else STREAM_DIR)

    def __init__(self, uri: str, storage: LakeStorage, stream_dir: str = STREAM_DIR):
        self.uri = uri.rstrip("/")
        self.stream_dir = stream_dir  # a routed shard's batches write under a directory of their own
        self.local = is_local(uri)
        if self.local:
            self.fs, self.root = None, self.uri.removeprefix("file://")
        else:
            self.fs, self.root = storage.filesystem(self.uri)

    def path(self, rel: str) -> str:
        return f"{self.root}/{unquote(rel)}"

    def reader(self, rel: str) -> pq.ParquetFile:
        if self.fs is None:
            return pq.ParquetFile(self.path(rel))
        return pq.ParquetFile(self.fs.open(self.path(rel), "rb"))

    def writer_sink(self, rel: str) -> Any:
        if self.fs is None:
            os.makedirs(os.path.dirname(self.path(rel)), exist_ok=True)
            return pa.OSFile(self.path(rel), "wb")
        return self.fs.open(self.path(rel), "wb")

    def write_bytes(self, rel: str, data: bytes | pa.Buffer) -> None:
        """A whole small file in one write (one PUT on an object store)."""
        if self.fs is not None:
            self.fs.pipe_file(self.path(rel), data if isinstance(data, bytes) else data.to_pybytes())
            return
        path = self.path(rel)
        directory = os.path.dirname(path)
        if directory not in _MADE_DIRS:
            os.makedirs(directory, exist_ok=True)
            _MADE_DIRS.add(directory)
        try:
            f = open(path, "wb")  # closed below
        except FileNotFoundError:  # the directory went since (a table's directory removed and made again)
            os.makedirs(directory, exist_ok=True)
            f = open(path, "wb")
        with f:
            f.write(data)

    def size(self, rel: str) -> int:
        return os.path.getsize(self.path(rel)) if self.fs is None else int(self.fs.size(self.path(rel)))

    def remove_uncommitted(self, prefix: str) -> None:
        """Delete directories of earlier, uncommitted attempts of this batch (local tables only:
        on an object store VACUUM removes them)."""
        if self.fs is not None:
            return
        parent = os.path.join(self.root, self.stream_dir)
        if not os.path.isdir(parent):
            return
        for name in os.listdir(parent):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


class _FileWriter:
    """Streams batches into data files of at most :data:`FILE_ROWS` rows, with the value ranges of
    the statistics columns the table's ``configuration`` declares (:mod:`sinks.delta_stats`)."""

    def __init__(self, files: _TableFiles, directory: str, stem: str, schema: pa.Schema,
                 configuration: Mapping[str, str] | None):  # fmt: skip
        self.files, self.directory, self.stem, self.schema = files, directory, stem, schema
        self.columns = [c for c in declared_stats_columns(configuration) or [] if c in schema.names]
        self.written: list[_NewFile] = []
        self._writer: pq.ParquetWriter | None = None
        self._sink: Any = None
        self._rel = ""
        self._rows = 0
        self._ranges: dict[str, tuple[Any, Any, int]] = {}

    def write(self, data: pa.Table | pa.RecordBatch) -> None:
        offset = 0
        while offset < data.num_rows:
            if self._writer is None:
                self._open()
            take = min(data.num_rows - offset, FILE_ROWS - self._rows)
            part = data.slice(offset, take)
            assert self._writer is not None
            self._writer.write(part if isinstance(part, pa.Table) else pa.Table.from_batches([part]))
            for c in self.columns:
                col = part.column(c)
                mm = pc.min_max(col)
                merge_range(self._ranges, c, mm["min"].as_py(), mm["max"].as_py(), col.null_count)
            self._rows += take
            offset += take
            if self._rows >= FILE_ROWS:
                self.close()

    def _open(self) -> None:
        self._rel = f"{self.directory}/{self.stem}-{len(self.written):04d}.parquet"
        self._sink = self.files.writer_sink(self._rel)
        self._writer = pq.ParquetWriter(self._sink, self.schema, use_dictionary=False, compression="snappy")
        self._rows, self._ranges = 0, {}

    def close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._sink.close()
        self.written.append(_NewFile(self._rel, self._rows, self.files.size(self._rel), self._ranges))
        self._writer = None


def apply_folded_changes(
    sink: DeltaSink,
    table: str,
    buckets: Iterable[FoldedBucket],
    primary_key: list[str],
    app_id: str,
    version: int,
    *,
    workdir: str,
    memory_bytes: int,
    progress: Progress | None = None,
    opened: DeltaTable | None = None,
) -> RewriteResult:
    """Apply the folded buckets of one micro-batch to ``table`` as one commit (see the module doc).

    ``workdir`` is a private local scratch directory; ``memory_bytes`` bounds the changed keys held
    at once (the rest is spilled there). ``progress(phase, details)`` is called as the work moves
    on, for the stream's log and status. A routed table (core/routing.py) rewrites only its shard's
    files and records the batch under its shard's app id. ``opened``: the table, if the caller has
    just opened it.
    """
    t0 = time.monotonic()
    route = sink.route_of(table)
    if route:
        app_id = route.app_id(app_id)
    report = progress or (lambda phase, details: None)
    dt = opened if opened is not None else sink.open(table)
    sink.check_owner(table, dt)
    from airflow_provider_mysqlcdc.sinks.delta_dv_purge import purge_deletion_vectors  # it builds on this module

    if purge_deletion_vectors(sink, table, dt):  # this rewrite reads files as Parquet and removes them by path
        dt = sink.open(table)
    if already_applied(dt, table, app_id, version):
        for _ in buckets:  # drain: the caller's scratch files are released as buckets are read
            pass
        return RewriteResult(applied=False, seconds=time.monotonic() - t0)
    full = pa.schema(dt.schema().to_arrow())
    # a routed table's source columns are partition values, not columns of its files
    target = file_schema(full) if route else full
    key = list(primary_key)
    key_schema = pa.schema([target.field(c) for c in key])
    files = _TableFiles.of(sink, table, route)
    prefix = f"b{version:010d}-"
    files.remove_uncommitted(prefix)
    directory = f"{files.stream_dir}/{prefix}{uuid.uuid4().hex[:12]}"
    os.makedirs(workdir, exist_ok=True)
    keys = ChangedKeys(key_schema, workdir, max(1, memory_bytes // 2))
    result = RewriteResult(applied=True)
    up_writer = _FileWriter(files, directory, "upserts", target, dt.metadata().configuration)
    for i, fb in enumerate(buckets):
        up = conform_upserts(table, target, fb.upserts, fill_absent=route is not None)
        if up.num_rows:
            up_writer.write(up.sort_by([(c, "ascending") for c in key]))
        keys.add(fb.changed_keys(key_schema))
        result.upserts += fb.upserts.num_rows
        result.deletes += fb.delete_keys.num_rows
        report("folding", {"buckets_folded": i + 1, "upserts": result.upserts, "deletes": result.deletes})
    up_writer.close()
    if not keys.count:
        return RewriteResult(applied=False, seconds=time.monotonic() - t0)

    for attempt in range(COMMIT_ATTEMPTS):
        if attempt:
            dt = sink.open(table)
            sink.check_owner(table, dt)
            done = dt.transaction_version(app_id)
            if done is not None and done >= version:
                log.info("%s: batch %s/%s was applied concurrently; skipped", table, app_id, version)
                return RewriteResult(applied=False, seconds=time.monotonic() - t0)
        current = pa.table(dt.get_add_actions(flatten=True))
        if route:  # only the shard's files
            mine = sink.table_files(table, dt)
            current = current.filter(pa.array([p in mine for p in current.column("path").to_pylist()], pa.bool_()))
        masks, passes = _match_target(files, current, keys, key, report)
        result.key_passes = passes
        rewrite = _FileWriter(files, directory, f"rewrite-{attempt:02d}", target, dt.metadata().configuration)
        removes: list[RemoveAction] = []
        now = int(time.time() * 1000)
        copied = 0
        for n, (rel, (size, mask)) in enumerate(masks.items()):
            copied += _copy_without(files, rel, mask, target, rewrite)
            removes.append(remove_action(rel, size, now))
            report("rewriting", {"files_rewritten": n + 1, "files_to_rewrite": len(masks), "rows_copied": copied})
        rewrite.close()
        new_files = up_writer.written + rewrite.written
        adds = _added(new_files, route, now, dt)
        commit = CommitProperties(
            app_transactions=[Transaction(app_id, version)],
            custom_metadata={"mysqlcdc": json.dumps({
                "app_id": app_id, "version": version, "upserts": result.upserts, "deletes": result.deletes,
                "bounded_rewrite": True,
            })},
        )  # fmt: skip
        report("committing", {"files_removed": len(removes), "files_added": len(adds)})
        try:
            dt.create_write_transaction([*removes, *adds], mode="append", schema=full, commit_properties=commit,
                                        partition_by=list(SOURCE_COLUMNS) if route else None)  # fmt: skip
        except CommitFailedError as exc:
            log.info("%s: commit of batch %s/%s conflicted with a concurrent commit (%s); matching again",
                     table, app_id, version, str(exc).splitlines()[0])
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        result.files_removed, result.files_added, result.rows_copied = len(removes), len(adds), copied
        result.version = sink.open(table).version()
        result.seconds = time.monotonic() - t0
        return result
    raise RuntimeError(
        f"could not apply batch {app_id}/{version} to {table}: {COMMIT_ATTEMPTS} attempts conflicted with "
        "concurrent commits; is another job writing this table?"
    )


def _match_target(
    files: _TableFiles, current: pa.Table, keys: ChangedKeys, key: list[str], report: Progress
) -> tuple[dict[str, tuple[int, np.ndarray]], int]:
    """``{file: (size, drop mask)}`` for every data file holding a changed key; and the pass count."""
    cols = current.to_pydict()
    paths = cols.get("path", [])
    sizes = cols.get("size_bytes", [])
    first = key[0]
    lo_stats, hi_stats = cols.get(f"min.{first}"), cols.get(f"max.{first}")
    masks: dict[str, np.ndarray] = {}
    passes = 0
    for group in keys.passes():
        passes += 1
        group = group.combine_chunks()
        lo, hi = None, None
        if pa.types.is_integer(group.schema.field(first).type) and group.num_rows:
            mm = pc.min_max(group.column(first))
            lo, hi = mm["min"].as_py(), mm["max"].as_py()

        def overlaps(i: int, lo: Any = lo, hi: Any = hi) -> bool:
            if lo is None or lo_stats is None or hi_stats is None:
                return True
            f_lo, f_hi = lo_stats[i], hi_stats[i]
            return not (isinstance(f_lo, int) and isinstance(f_hi, int) and (f_hi < lo or f_lo > hi))

        candidates = [(rel, lambda rel=rel: files.reader(rel).read(columns=key))
                      for i, rel in enumerate(paths) if overlaps(i)]  # fmt: skip
        for rel, hit in match_files(candidates, group, key, max(1 << 20, keys.budget // 2)):
            if hit.any():
                masks[rel] = masks[rel] | hit if rel in masks else hit
        report("matching", {"key_pass": passes, "files_with_changes": len(masks), "files": len(paths)})
    size_of = dict(zip(paths, sizes, strict=True))
    return {rel: (int(size_of[rel]), m) for rel, m in masks.items()}, passes


def _copy_without(files: _TableFiles, rel: str, drop: np.ndarray, schema: pa.Schema, out: _FileWriter) -> int:
    """Stream ``rel`` into ``out`` without the rows ``drop`` marks; the number of rows copied."""
    offset = 0
    copied = 0
    for batch in files.reader(rel).iter_batches(batch_size=READ_BATCH_ROWS):
        keep = ~drop[offset : offset + batch.num_rows]
        offset += batch.num_rows
        if keep.any():
            kept = _conform(pa.Table.from_batches([batch]).filter(pa.array(keep)), schema)
            out.write(kept)
            copied += kept.num_rows
    return copied


def write_sorted_rows(files: _TableFiles, rel: str, rows: pa.Table, key: list[str],
                      columns: list[str] | None) -> _NewFile:  # fmt: skip
    """``rows`` (sorted by ``key``) as one data file in one write, with the value ranges of the
    statistics ``columns``: the first key column's are its first and last values."""
    buf = pa.BufferOutputStream()
    pq.write_table(rows, buf, use_dictionary=False, compression="snappy")
    data = buf.getvalue()
    files.write_bytes(rel, data)
    ranges: dict[str, tuple[Any, Any, int]] = {}
    for c in columns or []:
        if c not in rows.column_names:
            continue
        col = rows.column(c)
        if c == key[0] and not col.null_count:
            ranges[c] = (col[0].as_py(), col[-1].as_py(), 0)
        else:
            mm = pc.min_max(col)
            ranges[c] = (mm["min"].as_py(), mm["max"].as_py(), col.null_count)
    return _NewFile(rel, rows.num_rows, data.size, ranges)


def checkpoint_table(sink: DeltaSink, table: str) -> None:
    """The checkpoint (and expired log cleanup) delta-rs' own commit would have made here: for a
    writer that commits by writing the log itself (``sinks/delta_log.py``)."""
    dt = sink.latest(table)
    dt.create_checkpoint()
    dt.cleanup_metadata()
    log.debug("%s: checkpoint at version %s", table, dt.version())


def _conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows of an older data file in the table's current schema: columns added since read NULL,
    widened columns are cast (what a Delta reader does with such a file)."""
    names = data.column_names
    cols = [data.column(f.name).cast(f.type) if f.name in names else pa.nulls(data.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


__all__ = ["RewriteResult", "apply_folded_changes", "checkpoint_table", "write_sorted_rows"]
