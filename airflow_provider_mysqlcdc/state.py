"""The pipeline state store: plans, chunk results, the stream manifest, checkpoints.

A directory per pipeline under ``state_root`` — a local path by default, or any fsspec URL
(``s3://``, ``gs://``, ``abfs://``...) when tasks run on several machines. Nothing about a pipeline
lives in process memory or in XCom beyond small summaries: Airflow's XCom is not a bulk store and
mapped tasks may run on different workers (docs/architecture.md, "State store").

Layout::

    <state_root>/<pipeline_id>/
        plans/<plan_id>/plan.json                 the plan record (PlanRecord)
        plans/<plan_id>/results/group-<g>.json    group g's report (GroupReport)
        current_plan.json                          the plan the stream was / will be built from (PlanPointer)
        manifest.json                              stream manifest (Manifest)
        checkpoint/                                stream checkpoint location
        stream/*.json                              the stream's control documents (core/stream_state.py)

Each document has a typed record that alone knows its JSON keys (docs/architecture.md, "State store").

Writes are atomic (write to a temporary name, then rename) so a reader never sees half a record.
"""

from __future__ import annotations

import difflib
import json
import os
import time
import uuid
from typing import Any

from fsspec.core import url_to_fs

from airflow_provider_mysqlcdc import storage as lake_storage
from airflow_provider_mysqlcdc.core.config import check_pipeline_id
from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.plan_record import PlanPointer, PlanRecord
from airflow_provider_mysqlcdc.core.records import ChunkResult, GroupReport
from airflow_provider_mysqlcdc.core.stream_state import (
    LaunchHandle,
    ReloadRequest,
    RunRecord,
    SchemaChange,
    StopRequest,
    StreamStatus,
)

MANIFEST = "manifest.json"
PLAN_POINTER = "current_plan.json"
# the stream's control documents (core/stream_state.py; stream/control.py re-exports the names)
RUN = "stream/run.json"
STOP_REQUEST = "stream/stop-request.json"
HANDLE = "stream/handle.json"
RELOAD = "stream/reload.json"  # a hand-over: pause after the running batch, resume with the new manifest
STATUS = "stream/status.json"
SCHEMA_CHANGE = "stream/schema-change.json"  # a DDL the running stream met and must follow


class StateStore:
    def __init__(self, state_root: str, pipeline_id: str, storage: lake_storage.LakeStorage | None = None):
        check_pipeline_id(pipeline_id)
        if not state_root:
            raise ValueError("state_root is empty: give a directory or URL for the pipeline state")
        self.storage = storage or lake_storage.LOCAL
        if lake_storage.is_local(str(state_root)):
            self.fs, root = url_to_fs(str(state_root))
        else:
            self.fs, root = self.storage.filesystem(str(state_root))
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.root = root.rstrip("/") + "/" + pipeline_id
        self.pipeline_id = pipeline_id
        self.state_root = str(state_root)

    # ---------------------------------------------------------------- primitives
    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def url(self, *parts: str) -> str:
        """A path other tools (Spark, delta-rs) understand: plain for local, ``proto://`` otherwise."""
        p = self.path(*parts)
        return p if self.protocol in ("file", "local") else f"{self.protocol}://{p}"

    def write_json(self, rel: str, obj: Any) -> None:
        target = self.path(rel)
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        data = json.dumps(obj, indent=1, sort_keys=True, default=str).encode()
        if self.protocol in ("file", "local"):
            tmp = f"{target}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        else:  # object stores: a single PUT is atomic
            with self.fs.open(target, "wb") as f:
                f.write(data)

    def read_json(self, rel: str, default: Any = None) -> Any:
        target = self.path(rel)
        try:
            # One whole-object GET. Not fs.open(): s3fs' file object pins the ETag it saw at open
            # and fails its read (FileExpired) when a writer replaces the document in between —
            # which the stream's run record, rewritten every few seconds, does all the time.
            return json.loads(self.fs.cat_file(target))
        except FileNotFoundError:
            return default

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.path(rel)))

    def list(self, rel: str) -> list[str]:
        try:
            return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self.path(rel), detail=False))
        except FileNotFoundError:
            return []

    def delete(self, rel: str) -> None:
        if self.fs.exists(self.path(rel)):
            self.fs.rm(self.path(rel), recursive=True)

    # ---------------------------------------------------------------- the stream manifest
    def read_manifest(self) -> Manifest | None:
        """The pipeline's stream manifest (None before the first hand-over); ``ManifestError`` if broken."""
        data = self.read_json(MANIFEST)
        return None if data is None else Manifest.from_dict(data)

    def write_manifest(self, manifest: Manifest) -> None:
        self.write_json(MANIFEST, manifest.to_dict())

    # ---------------------------------------------------------------- the stream's control documents
    def read_run(self) -> RunRecord | None:
        data = self.read_json(RUN)
        return None if not data else RunRecord.from_dict(data)

    def write_run(self, run: RunRecord) -> None:
        self.write_json(RUN, run.to_dict())

    def read_status(self) -> StreamStatus:
        """The stream's status; an empty one before its first batch."""
        return StreamStatus.from_dict(self.read_json(STATUS) or {})

    def write_status(self, status: StreamStatus) -> None:
        self.write_json(STATUS, status.to_dict())

    def read_reload(self) -> ReloadRequest | None:
        data = self.read_json(RELOAD)
        return None if not data else ReloadRequest.from_dict(data)

    def write_reload(self, request: ReloadRequest) -> None:
        self.write_json(RELOAD, request.to_dict())

    def read_stop_request(self) -> StopRequest | None:
        data = self.read_json(STOP_REQUEST)
        return None if not data else StopRequest.from_dict(data)

    def write_stop_request(self, request: StopRequest) -> None:
        self.write_json(STOP_REQUEST, request.to_dict())

    def read_schema_change(self) -> SchemaChange | None:
        data = self.read_json(SCHEMA_CHANGE)
        return None if not data else SchemaChange.from_dict(data)

    def write_schema_change(self, change: SchemaChange) -> None:
        self.write_json(SCHEMA_CHANGE, change.to_dict())

    def read_handle(self) -> LaunchHandle | None:
        data = self.read_json(HANDLE)
        return None if not data else LaunchHandle.from_dict(data)

    def write_handle(self, handle: LaunchHandle) -> None:
        self.write_json(HANDLE, handle.to_dict())

    # ---------------------------------------------------------------- plans and results
    def write_plan(self, plan_id: str, plan: dict[str, Any]) -> None:
        """A plan record as a dict (tools and tests write a bare ``SnapshotPlan.to_dict()``); the
        package writes :class:`PlanRecord` with :meth:`write_plan_record`."""
        self.write_json(f"plans/{plan_id}/plan.json", plan)

    def read_plan(self, plan_id: str) -> dict[str, Any]:
        plan = self.read_json(f"plans/{plan_id}/plan.json")
        if plan is None:
            raise FileNotFoundError(
                f"no plan {plan_id!r} for pipeline {self.pipeline_id!r} under {self.state_root}: run the plan "
                "step (MySqlCdcPlanOperator) first, or check state_root/pipeline_id"
            )
        return plan

    def write_plan_record(self, plan_id: str, record: PlanRecord) -> None:
        self.write_plan(plan_id, record.to_dict())

    def read_plan_record(self, plan_id: str) -> PlanRecord:
        """Plan ``plan_id``'s record; ``FileNotFoundError`` naming the fix if there is none."""
        return PlanRecord.from_dict(self.read_plan(plan_id))

    def write_plan_pointer(self, pointer: PlanPointer) -> None:
        self.write_json(PLAN_POINTER, pointer.to_dict())

    def read_plan_pointer(self) -> PlanPointer | None:
        """The last plan of the pipeline (None before the first)."""
        data = self.read_json(PLAN_POINTER)
        return None if not data else PlanPointer.from_dict(data)

    def write_group_report(self, plan_id: str, report: GroupReport) -> None:
        self.write_json(f"plans/{plan_id}/results/group-{report.group_id:05d}.json", report.to_dict())

    def read_group_report(self, plan_id: str, group_id: int) -> GroupReport | None:
        rec = self.read_json(f"plans/{plan_id}/results/group-{group_id:05d}.json")
        return None if rec is None else GroupReport.from_dict(rec)

    def write_group_error(self, plan_id: str, group_id: int, message: str) -> None:
        self.write_json(f"plans/{plan_id}/errors/group-{group_id:05d}.json", {"error": message, "at": time.time()})

    def read_group_error(self, plan_id: str, group_id: int) -> dict[str, Any] | None:
        return self.read_json(f"plans/{plan_id}/errors/group-{group_id:05d}.json")

    def clear_group_error(self, plan_id: str, group_id: int) -> None:
        self.delete(f"plans/{plan_id}/errors/group-{group_id:05d}.json")

    def read_all_results(self, plan_id: str) -> list[ChunkResult]:
        out: list[ChunkResult] = []
        for name in self.list(f"plans/{plan_id}/results"):
            if name.startswith("group-") and name.endswith(".json"):
                rec = self.read_json(f"plans/{plan_id}/results/{name}")
                out += GroupReport.from_dict(rec).chunks
        return out

    # ---------------------------------------------------------------- the pipeline itself
    def holds_pipeline(self) -> bool:
        """Whether anything of this pipeline is here: a plan, a manifest or a stream run."""
        return self.read_plan_pointer() is not None or self.read_manifest() is not None or self.read_run() is not None

    def pipelines_in_root(self) -> list[str]:
        """The pipeline ids with a directory under this store's state root."""
        try:
            entries = self.fs.ls(self.root.rsplit("/", 1)[0], detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")


def unknown_pipeline_problem(store: StateStore) -> str | None:
    """None when the store holds its pipeline; else what the state root holds and the fix. A typo'd
    pipeline id or root must not read as a pipeline whose every field is null, or as a stopped one."""
    if store.holds_pipeline():
        return None
    others = store.pipelines_in_root()
    close = difflib.get_close_matches(store.pipeline_id, others, n=1)
    return (
        f"no pipeline {store.pipeline_id!r} under state root {store.state_root}"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + f"; pipelines there: {', '.join(others) if others else 'none'}. Give the pipeline_id and state_root the "
        "mysql_cdc DAG ran it with"
    )
