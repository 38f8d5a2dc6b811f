"""Keep a streamed Delta table's disk use near its live data: compaction, checkpoints, vacuum.

Why: every micro-batch is a copy-on-write commit — the files holding changed keys are rewritten and
the old ones stay on disk for readers of older versions — and every commit adds a log entry. Left
alone, a table of a few MB of live rows grew to hundreds of MB within an hour. The stream runs
:func:`maintain_table` on each of its tables between two micro-batches, every
``maintenance_interval_seconds`` (so nothing else writes the table meanwhile):

1. **compaction** — when at least ``min_small_files`` data files are below ``small_file_mb``,
   delta-rs' ``optimize.compact`` bins them into files of ``target_file_mb`` (a commit without data
   change: readers and the stream's batch ids are unaffected);
2. **checkpoint** — a Parquet checkpoint of the log, then the log entries older than
   ``log_retention_hours`` are removed (the batch ids the stream records live in the checkpoint);
3. **vacuum** — data files no version newer than ``retention_hours`` refers to are deleted. A reader
   that opened an older version and reads for longer than that may find files gone: keep
   ``retention_hours`` above your longest read. With ``orphans`` (no snapshot of the pipeline in
   flight) files no version ever referred to — a crashed attempt's staging — go too.

The table's ``delta.logRetentionDuration`` / ``delta.deletedFileRetentionDuration`` are set to the
policy's values so other Delta tools honour the same retention.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake.exceptions import CommitFailedError

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
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _interval(hours: float) -> str:
    return f"interval {max(1, round(hours * 3600))} seconds"


def maintain_table(sink: DeltaSink, table: str, policy: MaintenancePolicy, orphans: bool = False) -> MaintenanceResult:
    """Compact, checkpoint and vacuum ``table`` once (see the module doc); safe to repeat."""
    t0 = time.monotonic()
    out = MaintenanceResult(table)
    dt = sink.open(table)
    sink.check_owner(table, dt)
    wanted = {
        "delta.logRetentionDuration": _interval(policy.log_retention_hours),
        "delta.deletedFileRetentionDuration": _interval(policy.retention_hours),
    }
    conf = dt.metadata().configuration or {}
    if any(conf.get(k) != v for k, v in wanted.items()):
        _retrying(table, lambda: sink.open(table).alter.set_table_properties(wanted, raise_if_not_exists=False))
        dt = sink.open(table)

    vectors = has_vectors_feature(dt)
    sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    small = [s for s in sizes if s < policy.small_file_mb * 2**20]
    if vectors:  # the stream compacts its batches' files itself (sinks/delta_dv_table.compact)
        log.debug("%s: has deletion vectors; compaction is the stream's own", table)
    elif len(small) >= policy.min_small_files:
        metrics = _retrying(
            table, lambda: sink.open(table).optimize.compact(target_size=int(policy.target_file_mb * 2**20))
        )
        out.compacted_files = int(metrics.get("numFilesRemoved", 0))
        dt = sink.open(table)
    dt.create_checkpoint()
    out.checkpoint_version = dt.version()
    dt.cleanup_metadata()
    if vectors:
        out.vacuumed_files = len(vacuum_table_with_vectors(sink, table, dt, policy.retention_hours * 3600, orphans))
    else:
        out.vacuumed_files = len(_vacuum(dt, policy.retention_hours * 3600, orphans))
    out.live_bytes = int(sum(pa.table(sink.open(table).get_add_actions(flatten=True)).column("size_bytes").to_pylist()))
    out.seconds = round(time.monotonic() - t0, 3)
    log.info("maintained %s: compacted %d files, checkpoint at version %s, vacuumed %d files, %.1f MiB live (%.2fs)",
             table, out.compacted_files, out.checkpoint_version, out.vacuumed_files, out.live_bytes / 2**20,
             out.seconds)  # fmt: skip
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


__all__ = ["MaintenancePolicy", "MaintenanceResult", "maintain_table"]
