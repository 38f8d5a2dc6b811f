"""Keep a streamed Delta table's disk use near its live data: compaction, checkpoints, vacuum.

Why: every micro-batch is a copy-on-write commit — the files holding changed keys are rewritten and
the old ones stay on disk for readers of older versions — and every commit adds a log entry. Left
alone, a table of a few MB of live rows grew to hundreds of MB within an hour. The stream runs
:func:`maintain_table` on each of its tables between two micro-batches, every
``maintenance_interval_seconds`` (so nothing else writes the table meanwhile):

1. **compaction** — when at least ``min_small_files`` data files are below ``small_file_mb``,
   delta-rs' ``optimize.compact`` bins them into files of ``target_file_mb`` (a commit without data
   change: readers and the stream's batch ids are unaffected);
2. **vacuum** — data files no version newer than ``retention_hours`` refers to are deleted. A reader
   that opened an older version and reads for longer than that may find files gone: keep
   ``retention_hours`` above your longest read. With ``orphans`` (no snapshot of the pipeline in
   flight) files no version ever referred to — a crashed attempt's staging — go too;
3. **checkpoint** — a Parquet checkpoint of the log, then the log entries older than
   ``log_retention_hours`` are removed (the batch ids the stream records live in the checkpoint).
   After the vacuum: the checkpoint leaves out the removes older than the retention, and the
   cleanup the entries, which the vacuum reads.

The table's ``delta.logRetentionDuration`` / ``delta.deletedFileRetentionDuration`` are set to the
policy's values so other Delta tools honour the same retention.

A **small table** (every shard of it within the stream's ``rewrite_below_mb``, with the stream's
``small_table_retention_seconds`` set: :attr:`DeltaSink.superseded`) keeps that much history
instead, for its files and its log alike: the stream deletes what its batches supersede once that
grace has passed (``sinks/delta_superseded.py``), and versions whose files are gone are of no use
to a reader. Here the vacuum catches what the stream could not (files superseded just before it
restarted), and the shorter log retention keeps the log — one entry per batch — and the tombstones
each checkpoint carries near the table's size (docs/architecture.md, "Committing small tables").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake.exceptions import CommitFailedError

from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_dv_purge import has_vectors_feature, vacuum_table_with_vectors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaintenancePolicy:
    """What the stream does to its tables, and how often (README "Table maintenance")."""

    interval_seconds: float = 600.0  # 0 disables maintenance by the stream
    retention_hours: float = 1.0  # unreferenced data files older than this are deleted
    log_retention_hours: float = 24.0  # log entries older than this go (after a checkpoint)
    small_file_mb: float = 16.0
    min_small_files: int = 8
    target_file_mb: float = 128.0

    def __post_init__(self) -> None:
        if self.interval_seconds < 0 or self.retention_hours < 0 or self.log_retention_hours < 0:
            raise ValueError("maintenance interval and retention must be >= 0")
        if self.log_retention_hours < self.retention_hours:
            raise ValueError("log_retention_hours must be >= retention_hours (versions inside the retention "
                             "must stay in the log)")


@dataclass
class MaintenanceResult:
    table: str
    compacted_files: int = 0
    checkpoint_version: int | None = None
    vacuumed_files: int = 0
    live_bytes: int = 0
    small: bool = False  # kept the small tables' retention
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _interval(seconds: float) -> str:
    return f"interval {max(1, round(seconds))} seconds"


def retention_properties(retention_seconds: float, log_retention_seconds: float) -> dict[str, str]:
    """The table properties that tell every Delta tool how long the table keeps removed files and log
    entries."""
    return {"delta.logRetentionDuration": _interval(log_retention_seconds),
            "delta.deletedFileRetentionDuration": _interval(retention_seconds)}  # fmt: skip


def small_table(sink: DeltaSink, dt: Any) -> bool:
    """Whether the table ``dt`` keeps the small tables' retention: the stream deletes what its batches
    supersede (``sink.superseded``) and every shard of it (the table, unrouted) is within
    ``sink.rewrite_below_bytes``."""
    if sink.superseded is None or not sink.rewrite_below_bytes:
        return False
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    sizes = actions.get("size_bytes", [])
    parts = [actions.get(f"partition.{c}", [None] * len(sizes)) for c in SOURCE_COLUMNS]
    shards: dict[tuple[Any, ...], int] = {}
    for i, n in enumerate(sizes):
        shard = tuple(p[i] for p in parts)
        shards[shard] = shards.get(shard, 0) + int(n)
    return max(shards.values(), default=0) <= sink.rewrite_below_bytes


def maintain_table(sink: DeltaSink, table: str, policy: MaintenancePolicy, orphans: bool = False) -> MaintenanceResult:
    """Compact, checkpoint and vacuum ``table`` once (see the module doc); safe to repeat."""
    t0 = time.monotonic()
    out = MaintenanceResult(table)
    dt = sink.open(table)
    sink.check_owner(table, dt)
    out.small, keep = small_table(sink, dt), sink.superseded
    retention = keep.retention_seconds if out.small and keep is not None else policy.retention_hours * 3600
    log_retention = retention if out.small else policy.log_retention_hours * 3600
    wanted = retention_properties(retention, log_retention)
    conf = dt.metadata().configuration or {}
    if any(conf.get(k) != v for k, v in wanted.items()):
        _retrying(table, lambda: sink.open(table).alter.set_table_properties(wanted, raise_if_not_exists=False))
        dt = sink.open(table)

    vectors = has_vectors_feature(dt)
    sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    small = [s for s in sizes if s < policy.small_file_mb * 2**20]
    if vectors:  # the stream compacts its batches' files itself (sinks/delta_dv_table.compact)
        log.debug("%s: has deletion vectors; compaction is the stream's own", table)
    elif out.small:  # the stream's whole rewrites keep it one file (a routed table: one per shard)
        log.debug("%s: a small table; its batches keep it compact", table)
    elif len(small) >= policy.min_small_files:
        metrics = _retrying(
            table, lambda: sink.open(table).optimize.compact(target_size=int(policy.target_file_mb * 2**20))
        )
        out.compacted_files = int(metrics.get("numFilesRemoved", 0))
        dt = sink.open(table)
    # the vacuum reads the removes of the log, which the checkpoint and the log cleanup then drop
    if vectors:  # a small table's: its superseded data files exactly, then the vectors and orphans
        exact = _vacuum(dt, retention, orphans=False) if out.small else []
        out.vacuumed_files = len(exact) + len(vacuum_table_with_vectors(sink, table, dt, retention, orphans))
    else:
        out.vacuumed_files = len(_vacuum(dt, retention, orphans))
    dt.create_checkpoint()
    out.checkpoint_version = dt.version()
    dt.cleanup_metadata()
    out.live_bytes = int(sum(pa.table(sink.open(table).get_add_actions(flatten=True)).column("size_bytes").to_pylist()))
    out.seconds = round(time.monotonic() - t0, 3)
    log.info("maintained %s: compacted %d files, checkpoint at version %s, vacuumed %d files, %.1f MiB live%s (%.2fs)",
             table, out.compacted_files, out.checkpoint_version, out.vacuumed_files, out.live_bytes / 2**20,
             f", a small table ({retention:.0f}s of history)" if out.small else "", out.seconds)  # fmt: skip
    return out


def _vacuum(dt: Any, retention_seconds: float, orphans: bool) -> list[str]:
    """Delete data files no version committed within ``retention_seconds`` refers to.

    delta-rs counts retention in whole hours; the versions inside the window are passed as
    ``keep_versions`` instead, so any retention (seconds in tests, hours in production) is exact.
    """
    cutoff_ms = (time.time() - retention_seconds) * 1000
    stamps = {int(h["version"]): h.get("timestamp", 0) for h in dt.history() if "version" in h}
    keep = {v for v, ts in stamps.items() if ts >= cutoff_ms} | {dt.version()}
    older = [v for v, ts in stamps.items() if ts < cutoff_ms]
    if older:  # the version that was current at the cutoff: a reader may still be reading it
        keep.add(max(older))
    keep = sorted(keep)
    return dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=orphans,
                     keep_versions=keep)  # fmt: skip


def _retrying(table: str, fn: Any) -> Any:
    for attempt in range(10):
        try:
            return fn()
        except CommitFailedError:
            time.sleep(0.1 * (attempt + 1))
    raise RuntimeError(f"maintenance of {table}: 10 attempts conflicted with concurrent commits")


__all__ = ["MaintenancePolicy", "MaintenanceResult", "maintain_table", "retention_properties", "small_table"]
