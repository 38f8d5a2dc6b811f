"""What a long micro-batch is doing, in the driver's log and in the stream's status.

A micro-batch of one huge transaction can run for minutes: its decoding tasks stage their change
blocks, then the driver folds and rewrites the table (``spill/bucketed_fold.py``,
``sinks/delta_rewrite.py``). Without word from it, a stream in that state looks hung, and when it
dies nobody knows which batch killed it. :class:`BatchProgress` watches the running batch from a
thread: a batch still running after a couple of seconds is announced in the log with its offsets
and binlog bytes, and ``stream/status.json`` gets a ``current_batch`` entry (phase, rows decoded so
far, offsets) refreshed every few seconds — which also tells the failure report
(``stream/failure.py``) what the stream was doing when its driver died.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.stream_state import StreamStatus
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import batch_offsets
from airflow_provider_mysqlcdc.stream.staged_blocks import batch_key, batch_progress

log = logging.getLogger(__name__)

REPORT_AFTER_SECONDS = 2.0
REPORT_EVERY_SECONDS = 5.0


class BatchProgress:
    """Context manager around one batch's work; :meth:`phase` records where the work is."""

    def __init__(
        self,
        store: StateStore,
        manifest: Manifest,
        batch_id: int,
        staging: str | None,
        last_status: StreamStatus | None,
        report_after: float = REPORT_AFTER_SECONDS,
        report_every: float = REPORT_EVERY_SECONDS,
    ):
        self.store = store
        self.manifest = manifest
        self.batch_id = batch_id
        self.staging = staging
        self.last_status = last_status or StreamStatus()
        self.report_after = report_after
        self.report_every = report_every
        self.started = time.time()
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._phase = "decoding"
        self._details: dict[str, Any] = {}
        self._range: dict[str, Any] | None = None
        self._announced = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"mysqlcdc-batch-{batch_id}", daemon=True)

    def __enter__(self) -> BatchProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    @property
    def announced(self) -> bool:
        """Whether the batch ran long enough to be reported as large."""
        return self._announced

    def phase(self, name: str, **details: Any) -> None:
        """Record the work's phase; a new phase of a batch already reported is reported at once."""
        with self._lock:
            changed = name != self._phase
            if changed:
                self._details = {}
            self._phase = name
            self._details.update(details)
        if changed and self._announced:
            self._wake.set()

    def snapshot(self) -> dict[str, Any]:
        """The ``current_batch`` entry: batch id, offsets, binlog bytes, phase, rows decoded so far."""
        if self._range is None:
            self._range = self._batch_range()
        with self._lock:
            phase, details = self._phase, dict(self._details)
        seconds = round(time.monotonic() - self._t0, 1)
        snap: dict[str, Any] = {"batch_id": self.batch_id, **self._range, "phase": phase,
                                "started_at": self.started, "seconds": seconds}  # fmt: skip
        if phase == "decoding" and self.staging and "start" in self._range:
            prog = batch_progress(self.staging, self._range["key"], self.store.storage)
            details.setdefault("rows_decoded", prog.get("rows_decoded_by_staging_tasks", 0))
            if prog.get("binlog_bytes"):
                snap["binlog_bytes"] = prog["binlog_bytes"]
        snap.update(details)
        return snap

    def _batch_range(self) -> dict[str, Any]:
        offs = batch_offsets(self.store, self.manifest, self.batch_id)
        if offs is None:
            return {}
        start, end = offs
        out: dict[str, Any] = {"start": start.to_dict(), "end": end.to_dict(), "key": batch_key(start, end)}
        if start.file == end.file:
            out["binlog_bytes"] = end.pos - start.pos
        return out

    def _watch(self) -> None:
        if self._stop.wait(self.report_after):
            return
        while not self._stop.is_set():
            try:
                snap = self.snapshot()
                self._report(snap)
            except Exception as exc:  # reporting must never break the batch
                log.debug("batch %s: progress report failed: %s", self.batch_id, exc)
            self._wake.wait(self.report_every)
            self._wake.clear()

    def _report(self, snap: dict[str, Any]) -> None:
        mib = snap.get("binlog_bytes")
        size = f"{mib / 2**20:.1f} MiB of binlog" if mib is not None else "binlog size unknown"
        where = f"{_fmt(snap.get('start'))} -> {_fmt(snap.get('end'))}"
        extra = ", ".join(f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k.replace('_', ' ')} {v}"
                          for k, v in snap.items() if k not in _SHOWN)  # fmt: skip
        if not self._announced:
            log.info("batch %d is large: %s (%s); %s", self.batch_id, where, size, snap["phase"])
            self._announced = True
        tail = f": {extra}" if extra else ""
        log.info("batch %d: %s for %.0fs%s", self.batch_id, snap["phase"], snap["seconds"], tail)
        self.store.write_status(self.last_status.with_progress(snap, time.time()))


_SHOWN = {"batch_id", "start", "end", "key", "binlog_bytes", "phase", "started_at", "seconds"}


def _fmt(off: dict[str, Any] | None) -> str:
    return "?" if not off else f"{off['file']}:{off['pos']}"


__all__ = ["BatchProgress"]
