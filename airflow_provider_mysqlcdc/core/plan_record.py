"""The plan record and the plan pointer: what a run's plan step hands to its snapshot and finalize steps.

``plans/<plan_id>/plan.json`` (:class:`PlanRecord`) is the snapshot plan (``SnapshotPlan.to_dict()``:
tables, groups, collations, methods) plus the run's decisions: its pipeline config, which tables it
snapshots, re-snapshots, takes over or starts at an offset, which are swapped in one commit at the
end, and — once finalized — the finalize outcome. ``current_plan.json`` (:class:`PlanPointer`)
names the last plan and whether it was finalized. Written by ``pipeline.plan_run``, read by the
snapshot group, the operators, the stream's maintenance and ``pipeline.finalize_run``; this module
is the only one that knows their JSON keys (docs/architecture.md, "State store").

Records written by earlier versions read: a missing key takes its default, and keys this version
does not know are kept and written back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.routing import Routes
from airflow_provider_mysqlcdc.core.server_ids import DEFAULT_MAX_PARALLEL_GROUPS, DEFAULT_STREAM_READERS
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.core.table_selection import TableSelection


@dataclass(frozen=True)
class OffsetStart:
    """A table the plan starts at an offset with no snapshot (``startup_mode`` latest/specific-offset)."""

    offset: BinlogOffset
    schema: dict[str, Any]  # TableSchema.to_dict()
    key_columns: list[dict[str, Any]]  # KeyColumn.to_dict() values
    collations: dict[str, dict[str, Any]] = field(default_factory=dict)  # Collation.to_dict() values

    def table_schema(self) -> TableSchema:
        return TableSchema.from_dict(self.schema)

    def collation_objects(self) -> dict[str, Collation]:
        return {k: Collation.from_dict(v) for k, v in self.collations.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset.to_dict(),
            "schema": self.schema,
            "key_columns": list(self.key_columns),
            "collations": dict(self.collations),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OffsetStart:
        return cls(
            BinlogOffset.from_dict(d["offset"]), d["schema"], list(d["key_columns"]), dict(d.get("collations") or {})
        )


_PLAN_KEYS = (
    "tables", "groups", "collations", "methods", "pipeline", "plan_id", "created_at", "snapshot_tables",
    "resnapshot_tables", "takeover_tables", "airflow_run_id", "deferred_commit_tables", "offset_tables",
    "skip_backfill", "finalized", "finalize_outcome", "repair_chunks", "recover_purged",
)  # fmt: skip


@dataclass
class PlanRecord:
    """``plans/<plan_id>/plan.json``; see the module doc."""

    # the snapshot plan (SnapshotPlan.to_dict()); empty when the run snapshots nothing
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: list[dict[str, Any]] = field(default_factory=list)
    collations: dict[str, dict[str, Any]] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)
    # the run's decisions
    pipeline: dict[str, Any] = field(default_factory=dict)  # PipelineConfig.to_dict()
    plan_id: str | None = None
    created_at: float | None = None
    snapshot_tables: list[str] = field(default_factory=list)
    resnapshot_tables: list[str] = field(default_factory=list)
    takeover_tables: list[str] = field(default_factory=list)
    airflow_run_id: str | None = None
    deferred_commit_tables: list[str] = field(default_factory=list)
    offset_tables: dict[str, OffsetStart] = field(default_factory=dict)
    repair_chunks: dict[str, list[int]] = field(default_factory=dict)  # table -> chunk ids re-snapshotted
    recover_purged: bool = False  # the stream's restart offset was purged: all re-snapshotted, new generation
    skip_backfill: bool = False
    finalized: bool = False
    finalize_outcome: dict[str, Any] | None = None  # FinalizeOutcome.to_dict(), once finalized
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know

    # ------------------------------------------------------------------ views
    @property
    def sink_root(self) -> str | None:
        return self.pipeline.get("sink_root") or None

    @property
    def startup_mode(self) -> str:
        return str(self.pipeline.get("startup_mode", "initial"))

    @property
    def stream_readers(self) -> int:
        """The stream's decoders the plan reserved server_ids for (``core/server_ids.py``)."""
        return int(self.pipeline.get("stream_readers") or DEFAULT_STREAM_READERS)

    @property
    def max_parallel_groups(self) -> int:
        return int(self.pipeline.get("max_parallel_groups") or DEFAULT_MAX_PARALLEL_GROUPS)

    @property
    def max_rows_per_second(self) -> int | None:
        """The snapshot's read throttle over all its groups (None: unlimited)."""
        rate = self.pipeline.get("max_rows_per_second")
        return int(rate) if rate else None

    @property
    def row_filters(self) -> dict[str, str]:
        """table -> SQL condition: the partial backfills of this run (``snapshot_filters`` of the
        tables it refreshes)."""
        filters = self.pipeline.get("snapshot_filters") or {}
        return {t: str(c) for t, c in filters.items() if t in self.repair_chunks}

    @property
    def metadata_columns(self) -> bool:
        """Whether the mirror tables this run writes carry the metadata columns."""
        return bool(self.pipeline.get("metadata_columns", False))

    @property
    def routes(self) -> Routes:
        """This run's routes of sharded tables into shared Delta tables (core/routing.py)."""
        return Routes.from_list(self.pipeline.get("routes"))

    def has_changelog(self, table: str) -> bool:
        """Whether this run's config gives ``table`` a changelog (``changelog_tables``)."""
        patterns = self.pipeline.get("changelog_tables") or []
        return bool(patterns) and TableSelection.parse(patterns).selects(table)

    @property
    def group_ids(self) -> list[int]:
        return [int(g["group_id"]) for g in self.groups]

    def table_schema(self, table: str) -> TableSchema:
        return TableSchema.from_dict(self.tables[table])

    def snapshot_plan(self) -> dict[str, Any]:
        """The snapshot plan part, as ``SnapshotPlan.from_dict`` and ``build_manifest`` take it."""
        return {"tables": self.tables, "groups": self.groups, "collations": self.collations, "methods": self.methods}

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **self.extra,
            **self.snapshot_plan(),
            "pipeline": self.pipeline,
            "plan_id": self.plan_id,
            "created_at": self.created_at,
            "snapshot_tables": list(self.snapshot_tables),
            "resnapshot_tables": list(self.resnapshot_tables),
            "takeover_tables": list(self.takeover_tables),
            "airflow_run_id": self.airflow_run_id,
            "deferred_commit_tables": list(self.deferred_commit_tables),
            "offset_tables": {t: o.to_dict() for t, o in self.offset_tables.items()},
            "skip_backfill": self.skip_backfill,
            "finalized": self.finalized,
        }
        if self.finalize_outcome is not None:
            out["finalize_outcome"] = self.finalize_outcome
        if self.repair_chunks:
            out["repair_chunks"] = {t: list(ids) for t, ids in self.repair_chunks.items()}
        if self.recover_purged:
            out["recover_purged"] = True
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanRecord:
        if not isinstance(d, dict):
            raise ValueError(f"a plan record is a JSON object, got {type(d).__name__}")
        return cls(
            tables=dict(d.get("tables") or {}),
            groups=list(d.get("groups") or []),
            collations=dict(d.get("collations") or {}),
            methods=dict(d.get("methods") or {}),
            pipeline=dict(d.get("pipeline") or {}),
            plan_id=d.get("plan_id"),
            created_at=d.get("created_at"),
            snapshot_tables=list(d.get("snapshot_tables") or []),
            resnapshot_tables=list(d.get("resnapshot_tables") or []),
            takeover_tables=list(d.get("takeover_tables") or []),
            airflow_run_id=d.get("airflow_run_id"),
            deferred_commit_tables=list(d.get("deferred_commit_tables") or []),
            offset_tables={t: OffsetStart.from_dict(o) for t, o in (d.get("offset_tables") or {}).items()},
            repair_chunks={t: [int(i) for i in ids] for t, ids in (d.get("repair_chunks") or {}).items()},
            recover_purged=bool(d.get("recover_purged", False)),
            skip_backfill=bool(d.get("skip_backfill", False)),
            finalized=bool(d.get("finalized", False)),
            finalize_outcome=d.get("finalize_outcome"),
            extra={k: v for k, v in d.items() if k not in _PLAN_KEYS},
        )


_POINTER_KEYS = ("plan_id", "tables", "finalized", "at", "airflow_run_id")


@dataclass
class PlanPointer:
    """``current_plan.json``: the plan the stream was / will be built from, and whether it was finalized."""

    plan_id: str | None = None
    tables: list[str] = field(default_factory=list)  # the tables the plan snapshots or starts at an offset
    finalized: bool = False
    at: float | None = None
    airflow_run_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.extra,
            "plan_id": self.plan_id,
            "tables": list(self.tables),
            "finalized": self.finalized,
            "at": self.at,
            "airflow_run_id": self.airflow_run_id,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanPointer:
        return cls(
            plan_id=d.get("plan_id"),
            tables=list(d.get("tables") or []),
            finalized=bool(d.get("finalized", False)),
            at=d.get("at"),
            airflow_run_id=d.get("airflow_run_id"),
            extra={k: v for k, v in d.items() if k not in _POINTER_KEYS},
        )


__all__ = ["OffsetStart", "PlanPointer", "PlanRecord"]
