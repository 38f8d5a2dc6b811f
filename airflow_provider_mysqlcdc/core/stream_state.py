"""The stream's control documents in the state store: run record, status, requests, launch handle.

A detached stream's driver, the operators, the sensor's trigger, the CLI and ``pipeline`` share
these through the state store (``stream/*.json``, paths in ``state.py``); this module is the only
one that knows their JSON keys (docs/architecture.md, "State store"). Every record reads what
earlier versions wrote (missing keys take their defaults) and keeps keys it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from airflow_provider_mysqlcdc.core.offset import BinlogOffset


def _split(cls: type, d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``d``'s keys that are fields of ``cls`` (but ``extra``), and the others."""
    names = {f.name for f in fields(cls)} - {"extra"}
    return {k: v for k, v in d.items() if k in names}, {k: v for k, v in d.items() if k not in names}


@dataclass
class RunRecord:
    """``stream/run.json``: written by the stream's driver (``StreamRunRecorder``), every heartbeat."""

    run_id: str | None = None
    state: str | None = None  # starting, running, stopping, paused, stopped, failed
    pid: int | None = None
    host: str | None = None
    started_at: float | None = None
    heartbeat_at: float = 0.0
    committed_offset: dict[str, Any] | None = None  # BinlogOffset.to_dict()
    error: str | None = None
    reload_id: str | None = None  # the hand-over the stream paused for
    reloaded: str | None = None  # the hand-over after which it restarted its query
    # which process ``pid`` is, for readers on the same host: its start time (clock ticks since
    # boot) tells it from a later process given the same pid, and the boot and pid namespace it ran
    # in tell a container that only shares the host name (stream/control.py, ``driver_process``)
    pid_start: int | None = None
    pid_space: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def committed(self) -> BinlogOffset | None:
        return None if not self.committed_offset else BinlogOffset.from_dict(self.committed_offset)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **self.extra,
            "run_id": self.run_id,
            "state": self.state,
            "pid": self.pid,
            "host": self.host,
            "started_at": self.started_at,
            "heartbeat_at": self.heartbeat_at,
            "committed_offset": self.committed_offset,
            "error": self.error,
        }
        if self.reload_id is not None:
            out["reload_id"] = self.reload_id
        if self.reloaded is not None:
            out["reloaded"] = self.reloaded
        if self.pid_start is not None:
            out["pid_start"] = self.pid_start
        if self.pid_space is not None:
            out["pid_space"] = self.pid_space
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        known, extra = _split(cls, d)
        known["heartbeat_at"] = float(known.get("heartbeat_at") or 0)
        return cls(**known, extra=extra)


@dataclass
class StreamStatus:
    """``stream/status.json``: the last batch the stream applied (as :meth:`finished` reports it), the
    last maintenance round, and the running batch's progress (``current_batch``: ``BatchProgress``'s
    snapshot, written while a large batch runs)."""

    batch: dict[str, Any] = field(default_factory=dict)  # the last batch's report; see finished()
    maintenance: dict[str, Any] | None = None  # the last maintenance round: {"at", "tables"}
    current_batch: dict[str, Any] | None = None

    @classmethod
    def finished(
        cls,
        batch_id: int,
        rows: int,
        rows_per_table: dict[str, int],
        last_event: BinlogOffset | None,
        lag_seconds: float | None,
        seconds: float,
        updated_at: float,
        bounded_apply: dict[str, Any] | None = None,
        large_batch: dict[str, Any] | None = None,
        maintenance: dict[str, Any] | None = None,
    ) -> StreamStatus:
        """The status after batch ``batch_id`` was applied (``lag_seconds`` None: it had no changes)."""
        batch: dict[str, Any] = {
            "batch_id": batch_id,
            "rows": rows,
            "rows_per_table": dict(rows_per_table),
            "last_event": None if last_event is None else {"file": last_event.file, "pos": last_event.pos},
            "lag_seconds": lag_seconds,
            "updated_at": updated_at,
            "seconds": seconds,
        }
        if bounded_apply:
            batch["bounded_apply"] = bounded_apply
        if large_batch is not None:
            batch["large_batch"] = large_batch
        return cls(batch, maintenance)

    @property
    def batch_id(self) -> int | None:
        return self.batch.get("batch_id")

    @property
    def rows(self) -> int:
        return int(self.batch.get("rows") or 0)

    @property
    def seconds(self) -> float | None:
        return self.batch.get("seconds")

    @property
    def lag_seconds(self) -> float | None:
        return self.batch.get("lag_seconds")

    def with_progress(self, current_batch: dict[str, Any], now: float) -> StreamStatus:
        """This status with the running batch's progress on top."""
        return replace(self, batch={**self.batch, "updated_at": now}, current_batch=current_batch)

    def last_batch(self) -> dict[str, Any] | None:
        """Everything but the running batch's progress (None when there is nothing)."""
        out = self.to_dict()
        out.pop("current_batch", None)
        return out or None

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.batch)
        if self.maintenance is not None:
            out["maintenance"] = self.maintenance
        if self.current_batch is not None:
            out["current_batch"] = self.current_batch
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamStatus:
        batch = {k: v for k, v in d.items() if k not in ("maintenance", "current_batch")}
        return cls(batch, d.get("maintenance"), d.get("current_batch"))


@dataclass
class ReloadRequest:
    """``stream/reload.json``: a hand-over asks the running stream to pause after its running batch
    (``requested``) and, once the manifest is merged, to restart its query with it (``ready``)."""

    reload_id: str
    run_id: str | None = None  # the run it is addressed to (None: any)
    state: str = "requested"  # requested, ready
    requested_at: float | None = None
    ready_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def requested(self) -> bool:
        return self.state == "requested"

    def to_dict(self) -> dict[str, Any]:
        out = {**self.extra, "reload_id": self.reload_id, "run_id": self.run_id, "state": self.state,
               "requested_at": self.requested_at}  # fmt: skip
        if self.ready_at is not None:
            out["ready_at"] = self.ready_at
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReloadRequest:
        known, extra = _split(cls, d)
        known.setdefault("reload_id", "")
        return cls(**known, extra=extra)


@dataclass
class StopRequest:
    """``stream/stop-request.json``: stop after the running batch."""

    run_id: str | None = None  # the run it is addressed to (None: any)
    requested_at: float = 0.0
    by: str | None = None  # the host that asked
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.extra, "run_id": self.run_id, "requested_at": self.requested_at, "by": self.by}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StopRequest:
        known, extra = _split(cls, d)
        known["requested_at"] = float(known.get("requested_at") or 0)
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class PendingDdl:
    """A DDL statement the stream met in a batch and stopped before."""

    table: str
    kind: str  # alter, truncate, drop, rename, create...
    sql: str
    offset: BinlogOffset

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "kind": self.kind, "sql": self.sql, "offset": self.offset.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PendingDdl:
        return cls(str(d["table"]), str(d["kind"]), str(d["sql"]), BinlogOffset.from_dict(d["offset"]))


@dataclass
class SchemaChange:
    """``stream/schema-change.json``: the DDL a batch met; the stream follows it before going on."""

    batch_id: int | None
    changes: list[PendingDdl]
    at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.extra, "batch_id": self.batch_id, "changes": [c.to_dict() for c in self.changes],
                "at": self.at}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SchemaChange:
        known, extra = _split(cls, d)
        changes = [PendingDdl.from_dict(c) for c in known.pop("changes", None) or []]
        return cls(known.get("batch_id"), changes, known.get("at"), extra)


@dataclass
class LaunchHandle:
    """``stream/handle.json``: how a detached stream was launched (for its log and a forced stop)."""

    run_id: str | None = None
    mode: str = "detached"
    launcher_pid: int | None = None  # spark-submit's pid
    host: str | None = None
    log_path: str | None = None
    started_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what the launcher adds (the Spark master...)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "mode": self.mode,
            "launcher_pid": self.launcher_pid,
            "host": self.host,
            "log_path": self.log_path,
            "started_at": self.started_at,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LaunchHandle:
        known, extra = _split(cls, d)
        return cls(**known, extra=extra)


__all__ = [
    "LaunchHandle",
    "PendingDdl",
    "ReloadRequest",
    "RunRecord",
    "SchemaChange",
    "StopRequest",
    "StreamStatus",
]
