"""Change blocks handed from the decoding tasks to the driver through storage, not through Spark.

Why: Spark collects a micro-batch's output on the driver (``foreachBatch`` → ``toArrow``), in the
JVM heap first. One transaction of a million changed rows makes one micro-batch (a batch ends only
at a transaction boundary) and several hundred MB of change blocks — an ``OutOfMemoryError`` that
repeats on every restart. A task whose output passes ``max_inline_bytes`` therefore writes the
rest of its blocks to Arrow IPC files under the pipeline's staging directory (in the state store,
which executors and driver share) and sends Spark one small ``staged`` row per table naming the
file. The driver folds them in bounded memory (``spill/bucketed_fold.py``) and deletes them after the
batch is applied; files of a batch that never finished are removed when the stream starts.

Layout under ``<state_root>/<pipeline>/stream/staged/``::

    <batch>/batch.json                 the batch's range and binlog bytes (driver, large batches)
    <batch>/progress-<task>.json       changes decoded so far by one task (while it stages)
    <batch>/part-<task>-<attempt>-<n>.arrow    staged blocks of one table (named in the ``staged`` row)

``<batch>`` is :func:`batch_key` of the micro-batch's offsets, so the driver finds a batch's
progress from its checkpoint offsets alone.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.storage import LOCAL, LakeStorage, is_local

log = logging.getLogger(__name__)

BATCH_INFO = "batch.json"
PROGRESS_EVERY_SECONDS = 2.0


def batch_key(start: BinlogOffset, end: BinlogOffset) -> str:
    return f"{start.file}.{start.pos}-{end.file}.{end.pos}"


def _fs(url: str, storage: LakeStorage) -> tuple[Any, str, bool]:
    """(fsspec filesystem or None for a local path, path, is_local)."""
    if is_local(url):
        return None, url.removeprefix("file://"), True
    fs, path = storage.filesystem(url)
    return fs, path, False


def _write_json(url: str, obj: Any, storage: LakeStorage) -> None:
    fs, path, local = _fs(url, storage)
    data = json.dumps(obj).encode()
    if local:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    else:
        with fs.open(path, "wb") as f:
            f.write(data)


def _read_json(url: str, storage: LakeStorage) -> Any:
    try:  # progress files are rewritten while the driver reads them: one whole read
        return json.loads(storage.read_bytes(url))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class StagedBlockWriter:
    """A decoding task's staged output: one Arrow IPC file per table, opened on first use."""

    def __init__(self, staging: str, batch: str, task: int, storage: LakeStorage = LOCAL):
        self.dir = f"{staging.rstrip('/')}/{batch}"
        self.storage = storage
        self.task = task
        self.attempt = uuid.uuid4().hex[:10]  # a retried task writes new files; only the reported ones count
        self._files: dict[str, dict[str, Any]] = {}
        self._writers: dict[str, pa.ipc.RecordBatchFileWriter] = {}
        self._sinks: dict[str, Any] = {}
        self._last_progress = time.monotonic()  # a short task never reports

    @property
    def active(self) -> bool:
        return bool(self._writers) or bool(self._files)

    def write(self, table: str, block: pa.RecordBatch, first_seq: int, tx: BinlogOffset, commit_ts: int) -> None:
        info = self._files.get(table)
        if info is None:
            url = f"{self.dir}/part-{self.task:05d}-{self.attempt}-{len(self._files):04d}.arrow"
            fs, path, local = _fs(url, self.storage)
            if local:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                sink = pa.OSFile(path, "wb")
            else:
                sink = fs.open(path, "wb")
            self._sinks[table] = sink
            self._writers[table] = pa.ipc.new_file(sink, block.schema)
            info = self._files[table] = {"table": table, "path": url, "blocks": 0, "rows": 0, "bytes": 0,
                                         "first_seq": first_seq, "file": tx.file, "pos": tx.pos,
                                         "commit_ts": 0}  # fmt: skip
        self._writers[table].write_batch(block)
        info["blocks"] += 1
        info["rows"] += block.num_rows
        info["bytes"] += block.nbytes
        info["file"], info["pos"] = tx.file, tx.pos
        info["commit_ts"] = max(info["commit_ts"], commit_ts)

    def report_progress(self, decoded: int, position: str, force: bool = False) -> None:
        """Record how many changes this task has decoded (read by the driver for the batch status)."""
        now = time.monotonic()
        if not force and now - self._last_progress < PROGRESS_EVERY_SECONDS:
            return
        self._last_progress = now
        try:
            _write_json(f"{self.dir}/progress-{self.task:05d}.json",
                        {"task": self.task, "decoded": decoded, "position": position, "at": time.time()},
                        self.storage)  # fmt: skip
        except OSError as exc:  # progress is informative; never fail the read for it
            log.debug("could not write progress: %s", exc)

    def close(self) -> list[dict[str, Any]]:
        """Finish the files; one record per table (table, path, blocks, rows, bytes, first_seq, last tx)."""
        for w in self._writers.values():
            w.close()
        for s in self._sinks.values():
            s.close()
        self._writers, self._sinks = {}, {}
        return list(self._files.values())


def read_staged_blocks(url: str, storage: LakeStorage = LOCAL) -> Iterator[pa.RecordBatch]:
    """The blocks of one staged file, one at a time."""
    fs, path, local = _fs(url, storage)
    src = pa.OSFile(path, "rb") if local else fs.open(path, "rb")
    with src:
        reader = pa.ipc.open_file(src)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def write_batch_info(staging: str, batch: str, info: dict[str, Any], storage: LakeStorage = LOCAL) -> None:
    _write_json(f"{staging.rstrip('/')}/{batch}/{BATCH_INFO}", info, storage)


def batch_progress(staging: str, batch: str, storage: LakeStorage = LOCAL) -> dict[str, Any]:
    """The batch's planned range and bytes (if recorded) and the changes its tasks decoded so far."""
    base = f"{staging.rstrip('/')}/{batch}"
    info = _read_json(f"{base}/{BATCH_INFO}", storage) or {}
    fs, path, local = _fs(base, storage)
    try:
        names = os.listdir(path) if local else [p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        names = []
    decoded = 0
    tasks = 0
    for name in names:
        if name.startswith("progress-") and name.endswith(".json"):
            rec = _read_json(f"{base}/{name}", storage) or {}
            decoded += int(rec.get("decoded", 0))
            tasks += 1
    return {**info, "rows_decoded_by_staging_tasks": decoded, "staging_tasks": tasks}


def remove_batch(staging: str, batch: str, storage: LakeStorage = LOCAL) -> None:
    """Drop a batch's staged files once it is applied (they are never read again)."""
    _remove(f"{staging.rstrip('/')}/{batch}", storage)


def clear_staging(staging: str, storage: LakeStorage = LOCAL) -> None:
    """Drop everything staged (at stream start no batch is running; a replay stages afresh)."""
    _remove(staging.rstrip("/"), storage)


def _remove(url: str, storage: LakeStorage) -> None:
    fs, path, local = _fs(url, storage)
    try:
        if local:
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        elif fs.exists(path):
            fs.rm(path, recursive=True)
    except OSError as exc:  # leftovers are only disk space; the next start clears them
        log.warning("could not remove staged change blocks %s: %s", url, exc)


__all__ = [
    "StagedBlockWriter",
    "batch_key",
    "batch_progress",
    "clear_staging",
    "read_staged_blocks",
    "remove_batch",
    "write_batch_info",
]
