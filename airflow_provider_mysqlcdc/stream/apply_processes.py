"""Processes that apply a micro-batch's tables, each owning a fixed share of them.

Why: a batch over hundreds of small tables is hundreds of small folds, Parquet writes and log
entries, each a few milliseconds of Python. Threads overlap their file I/O but share one GIL, so
the driver applies them on one core whatever the machine has. Each process here owns the tables
whose Delta table hashes to it — and with them the state the stream carries per table
(``sinks/delta_table_state.py``) — so a table's batches always go to the same process, in order,
and its carried rows live in one place. Every table still gets one commit per batch tagged
``(app_id, batch_id)``: a process that dies mid-batch is replaced, and the batch's tables are sent
again; those it had committed find their batch id and skip (docs/architecture.md, "Applying a
batch's tables at once").

Whatever else writes a table (the driver's bounded apply, a schema change, maintenance) makes the
owner's carried state stale; its next commit then finds its version taken and reads the table
again, as with any other writer.
"""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing
import os
import threading
import time
import zlib
from collections import defaultdict
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_table_state import ROWS_BUDGET_BYTES, TableStates
from airflow_provider_mysqlcdc.storage import LakeStorage
from airflow_provider_mysqlcdc.stream.table_apply import TableChangeApplier

log = logging.getLogger(__name__)

#: With ``apply_processes`` unset, a stream capturing at least this many tables applies them in
#: processes (fewer: the driver's threads; a process per share costs a start and a copy of each
#: batch's blocks, which only many tables per batch repay).
AUTO_MIN_TABLES = 64
#: With ``apply_processes`` unset, at most this many processes (and no more than the driver's cores).
AUTO_MAX_PROCESSES = 4


def processes_for(setting: int | None, tables: int, cores: int | None = None) -> int:
    """How many apply processes a stream over ``tables`` tables uses: ``setting`` when given (0: the
    driver's threads); unset, one per core up to :data:`AUTO_MAX_PROCESSES` from
    :data:`AUTO_MIN_TABLES` tables on, on a driver with at least two cores."""
    if setting is not None:
        return max(0, setting)
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if tables < AUTO_MIN_TABLES or cores < 2:
        return 0
    return min(AUTO_MAX_PROCESSES, cores)


def share_of(unit: str, count: int) -> int:
    """The process owning the Delta table at ``unit`` (its URI): stable across batches and restarts."""
    return zlib.crc32(unit.encode()) % count


@dataclass(frozen=True)
class ApplySpec:
    """What a process needs to apply its tables: the sink's settings and the stream's manifest.
    Picklable; the storage options travel over the process's pipe, never in its arguments."""

    sink_root: str
    storage_json: str
    owner: str | None
    takeover: tuple[str, ...]
    rewrite_below_bytes: int
    deletion_vectors: bool
    small_table_retention_seconds: float | None
    manifest_json: str
    app_id: str
    threads: int
    rows_budget: int

    @classmethod
    def of(cls, sink: DeltaSink, manifest: Manifest, app_id: str, threads: int, processes: int) -> ApplySpec:
        return cls(
            sink_root=sink.root, storage_json=sink.storage.to_json(), owner=sink.owner,
            takeover=tuple(sorted(sink.takeover)), rewrite_below_bytes=sink.rewrite_below_bytes,
            deletion_vectors=sink.deletion_vectors, manifest_json=manifest.to_json(), app_id=app_id,
            small_table_retention_seconds=None if sink.superseded is None else sink.superseded.retention_seconds,
            threads=threads, rows_budget=max(ROWS_BUDGET_BYTES // max(processes, 1), 16 << 20),
        )  # fmt: skip


class ApplyProcesses:
    """``count`` processes, each applying the tables of its share (:func:`share_of`) of every batch.

    Started when first used, with the ``spawn`` method (a Spark driver must not be forked); a
    process that dies is replaced at the next use. :meth:`close` stops them.
    """

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"apply_processes must be at least 1 to start processes, got {count}")
        self.count = count
        self._spec: ApplySpec | None = None
        self._pools: list[ProcessPoolExecutor | None] = [None] * count
        self._lock = threading.Lock()
        self._logs: _ProcessLogs | None = None  # the processes' log records, handled in the driver

    def configure(self, spec: ApplySpec) -> None:
        """Apply with ``spec`` from now on (a query (re)start: its manifest). Running processes keep
        the table states they carry; a state a restart made stale is read again at its next commit."""
        self._spec = spec
        futures = [pool.submit(_configure, spec) for pool in self._pools if pool is not None]
        for f in futures:
            try:
                f.result()
            except BrokenProcessPool:
                pass  # replaced (with this spec) at its next use

    def prime(self, units: dict[str, list[str]]) -> int:
        """Load the carried state of the tables in ``units`` (Delta table URI -> its source tables)
        in the processes that own them, all at once; the number of tables that carry one."""
        shares: dict[int, list[str]] = defaultdict(list)
        for uri, tables in units.items():
            shares[share_of(uri, self.count)].extend(tables)
        return sum(self._run(shares, _prime_share, parallel=True).values())

    def apply(self, batch_id: int, work: dict[str, list[bytes]], units: dict[str, list[str]],
              parallel: bool = True) -> None:  # fmt: skip
        """Apply batch ``batch_id``'s ``work`` (table -> its change blocks), ``units`` grouping the
        tables by the Delta table they write. ``parallel``: the processes at once (False: one after
        another, when the batch's folds together exceed the memory one table may use). Raises the
        first table's failure."""
        shares: dict[int, dict[str, list[bytes]]] = defaultdict(dict)
        for uri, tables in units.items():
            share = shares[share_of(uri, self.count)]
            for t in tables:
                share[t] = work[t]
        self._run(shares, _apply_share, parallel, batch_id)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, [None] * self.count
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        logs, self._logs = self._logs, None
        if logs is not None:
            logs.stop()

    def __enter__(self) -> ApplyProcesses:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _pool(self, i: int) -> ProcessPoolExecutor:
        with self._lock:
            pool = self._pools[i]
            if pool is None:
                if self._spec is None:
                    raise RuntimeError("ApplyProcesses.configure must be called before the processes are used")
                context = multiprocessing.get_context("spawn")
                if self._logs is None:
                    self._logs = _ProcessLogs(context)
                pool = self._pools[i] = ProcessPoolExecutor(
                    1, mp_context=context, initializer=_start,
                    initargs=(self._spec, self._logs.queue, logging.getLogger(_PACKAGE).getEffectiveLevel()),
                )  # fmt: skip
                log.info("apply process %d of %d starting", i + 1, self.count)
            return pool

    def _run(self, shares: dict[int, Any], fn: Any, parallel: bool, *args: Any) -> dict[int, Any]:
        """``fn(share, *args)`` in each share's process; a process that died is replaced and its
        share sent once more (what it committed is skipped by its batch id)."""
        results: dict[int, Any] = {}
        pending: list[tuple[int, Future[Any]]] = []
        for i, share in sorted(shares.items()):
            if not share:
                continue
            pending.append((i, self._submit(i, fn, share, args)))
            if not parallel:
                results[i] = self._result(i, pending.pop()[1], fn, share, args)
        failure: BaseException | None = None
        for i, future in pending:
            try:
                results[i] = self._result(i, future, fn, shares[i], args)
            except BaseException as exc:  # wait for the others before raising: no table half-sent
                failure = failure or exc
        if failure is not None:
            raise failure
        return results

    def _submit(self, i: int, fn: Any, share: Any, args: tuple[Any, ...]) -> Future[Any]:
        try:
            return self._pool(i).submit(fn, share, *args)
        except BrokenProcessPool:  # died since the last batch
            self._replace(i, "since the last batch")
            return self._pool(i).submit(fn, share, *args)

    def _result(self, i: int, future: Future[Any], fn: Any, share: Any, args: tuple[Any, ...]) -> Any:
        try:
            return future.result()
        except BrokenProcessPool:
            self._replace(i, f"applying {len(share)} table(s); sending them once more")
        try:
            return self._pool(i).submit(fn, share, *args).result()
        except BrokenProcessPool as exc:
            self._replace(i, "again")
            raise RuntimeError(
                f"apply process {i + 1} of {self.count} died twice in a row (its error, if it had time to say it, "
                "is in the driver's output above; out of memory is the usual cause): give the driver more memory, "
                "or apply in the driver with apply_processes=0"
            ) from exc

    def _replace(self, i: int, when: str) -> None:
        log.warning("apply process %d of %d died %s; starting it again", i + 1, self.count, when)
        with self._lock:
            broken, self._pools[i] = self._pools[i], None
        if broken is not None:
            broken.shutdown(wait=False, cancel_futures=True)


#: The package whose loggers' records the processes send to the driver (at the driver's level).
_PACKAGE = __name__.split(".")[0]


class _ProcessLogs:
    """The processes' log records, handled by the driver's loggers of the same names: a spawned
    process has no logging set up, and its lines belong in the stream's log with the batch lines."""

    def __init__(self, context: Any):
        self.queue = context.Queue()
        self._listener = logging.handlers.QueueListener(self.queue, _ToDriverLogger())
        self._listener.start()

    def stop(self) -> None:
        self._listener.stop()
        self.queue.close()


class _ToDriverLogger(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


# ---------------------------------------------------------------------- process side
_applier: TableChangeApplier | None = None
_threads = 1


def _start(spec: ApplySpec, logs: Any, level: int) -> None:
    """A new process: its records go to the driver through ``logs`` (this package's at the driver's
    level, others' warnings), then :func:`_configure`."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(logging.handlers.QueueHandler(logs))
    root.setLevel(logging.WARNING)
    logging.getLogger(_PACKAGE).setLevel(level)
    _configure(spec)


def _configure(spec: ApplySpec) -> None:
    """A process's sink (kept across manifests: it carries the table states) and manifest."""
    global _applier, _threads
    manifest = Manifest.from_json(spec.manifest_json)
    sink = _applier.sink if _applier is not None else None
    if sink is None or sink.root != spec.sink_root.rstrip("/") or sink.owner != spec.owner:
        sink = DeltaSink(spec.sink_root, LakeStorage.from_json(spec.storage_json), owner=spec.owner)
        sink.table_states = TableStates(spec.rows_budget)
    sink.takeover = set(spec.takeover)
    sink.rewrite_below_bytes = spec.rewrite_below_bytes
    sink.deletion_vectors = spec.deletion_vectors
    sink.keep_superseded_for(spec.small_table_retention_seconds)
    sink.routes = manifest.selection.routing
    _applier, _threads = TableChangeApplier(sink, manifest, spec.app_id), max(1, spec.threads)


def _apply_share(share: dict[str, list[bytes]], batch_id: int) -> int:
    """This process's tables of a batch, a thread per Delta table (up to the stream's apply_threads);
    then the superseded files of its other tables past their grace go."""
    from airflow_provider_mysqlcdc.sinks.delta_small_table import sweep_superseded

    t0 = time.monotonic()
    _current().apply_all(share, batch_id, _threads)
    sweep_superseded(_current().sink)
    log.debug("batch %d: %d tables applied in %.2fs", batch_id, len(share), time.monotonic() - t0)
    return len(share)


def _prime_share(tables: list[str]) -> int:
    from airflow_provider_mysqlcdc.sinks.delta_small_table import prime_table_state

    applier = _current()
    sink = applier.sink
    return sum(prime_table_state(sink, t, sink.latest(t), applier.app_id) for t in tables if sink.exists(t))


def _current() -> TableChangeApplier:
    if _applier is None:
        raise RuntimeError("apply process used before it was configured")
    return _applier


__all__ = ["AUTO_MAX_PROCESSES", "AUTO_MIN_TABLES", "ApplyProcesses", "ApplySpec", "processes_for", "share_of"]
