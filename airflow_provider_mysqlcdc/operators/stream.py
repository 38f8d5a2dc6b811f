"""``MySqlCdcStreamOperator`` (hand the snapshot over to the binlog stream) and ``MySqlCdcStopStreamOperator``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, TriggerRule

from airflow_provider_mysqlcdc.core.config import STREAM_MODES
from airflow_provider_mysqlcdc.core.schema_policy import check_policy
from airflow_provider_mysqlcdc.operators._spark import MySqlCdcSparkSubmitOperator, job_path


class MySqlCdcStreamOperator(MySqlCdcSparkSubmitOperator):
    """Aggregate the snapshot's high watermarks and launch the pipeline's long-lived binlog stream.

    It takes the mapped snapshot tasks' XCom summaries (``snapshot.output``) and the plan id
    (``plan.output["plan_id"]``), checks that every planned group reported and every planned
    chunk has a result in the state store, builds the stream manifest — start offset = the
    minimum HW, per-chunk filters — merged with the tables the pipeline already captures, swaps
    re-snapshotted tables into the sink, checks that the binlog at the start offset (or the
    stream's checkpoint) still exists, and starts the stream:

    * ``stream_mode="detached"`` (default): the Spark job runs on after the task; the task returns
      a handle (run id, pid, host, driver log) once the stream reports running. Watch it with
      ``MySqlCdcStreamSensor``, stop it with ``MySqlCdcStopStreamOperator`` or ``mysqlcdc stop``.
    * ``stream_mode="attached"``: the task is the stream (the parent's submit); it ends when the
      stream stops, and an Airflow retry restarts it from its checkpoint. ``on_kill`` stops it
      gracefully, then the parent's ``on_kill`` makes sure spark-submit is gone.

    The pipeline's config comes from the plan, not from arguments: with the plan's ``startup_mode``
    ``snapshot-only`` the manifest is recorded and no stream is started; ``sink_root`` defaults to
    the plan's. If the stream already runs and nothing was added, it is left alone (re-triggering
    the DAG is safe). The default trigger rule is ``none_failed``: a run that snapshots nothing
    (zero mapped tasks) still (re)starts the stream.

    The stream maintains its Delta tables between batches every ``maintenance_interval_seconds``
    (default 600; 0 = never): compaction, checkpoint, and vacuum of files unreferenced for
    ``vacuum_retention_hours`` (default 1; keep it above your longest read) — README "Table
    maintenance". Small tables (up to ``rewrite_below_mb``, default 2) keep
    ``small_table_retention_seconds`` of history instead (default 120): what their batches supersede
    is deleted that long after, and they are rewritten whole at most once per that time, so their
    disk stays a small multiple of their live data — README "Table maintenance".

    A transaction of any size is applied in bounded memory (README "Large transactions"):
    ``driver_memory`` sizes the stream driver's JVM, ``apply_memory_mb`` (default 512) what its
    Python may use to fold one table's changes of a micro-batch before it spills to local disk.

    :param snapshot_summaries: the mapped snapshot tasks' XComs (``snapshot.output``)
    :param stream_mode: ``detached`` or ``attached`` (see above)
    :param trigger_seconds: the stream's micro-batch trigger interval
    :param readers: binlog decoders reading in parallel; default and maximum: the plan's
        ``stream_readers``, the stream's share of the connection's ``server_id_range``
    :param max_bytes_per_trigger: binlog bytes one micro-batch may take
    :param apply_threads: tables of one micro-batch applied at once (default 4; 1 = one by one)
    :param apply_processes: processes applying a micro-batch's tables, each owning a share of them
        (default: one per driver core, at most 4, for a stream of 64 tables or more; 0 = the
        driver's threads only) — README "Large transactions", its settings table
    :param rewrite_below_mb: tables (routed shards) up to this size take a batch from the rows the
        stream keeps in memory, committed by the stream itself (default 2; 0 = never)
    :param small_table_retention_seconds: how long a reader of an older version of a small table has
        to read it; also how often such a table may be rewritten whole (default 120)
    :param deletion_vectors: bigger tables (one integer key) take a batch with Delta deletion vectors,
        rewriting only the changed rows (default True); False keeps the copy-on-write MERGE, for
        readers without deletion-vector support — README "Big tables"
    :param schema_change_policy: what a DDL of a captured table does — ``lenient`` (default: the lake
        keeps what it holds), ``evolve`` (the lake follows the source), ``fail`` (stop before it);
        README "Schema changes". Takes effect when the stream (re)starts.
    :param start_timeout: seconds a detached stream has to report running
    :param stop_timeout: seconds to wait for a running stream to stop gracefully
    :param kwargs: the CDC arguments of :class:`MySqlCdcSparkSubmitOperator` and every argument of
        ``SparkSubmitOperator``
    """

    template_fields: Sequence[str] = (
        *MySqlCdcSparkSubmitOperator.template_fields, "snapshot_summaries", "stream_mode", "schema_change_policy",
        "rewrite_below_mb", "small_table_retention_seconds", "vacuum_retention_hours",
    )
    ui_color = "#e6f5e6"

    def __init__(
        self,
        *,
        snapshot_summaries: Any = None,
        stream_mode: str = "detached",
        trigger_seconds: float = 1.0,
        readers: int | None = None,
        max_bytes_per_trigger: int | None = None,
        apply_memory_mb: int | None = None,
        apply_threads: int | None = None,
        apply_processes: int | None = None,
        deletion_vectors: bool = True,
        schema_change_policy: str | None = None,
        maintenance_interval_seconds: float | None = None,
        vacuum_retention_hours: float | None = None,
        rewrite_below_mb: int | None = None,
        small_table_retention_seconds: float | None = None,
        start_timeout: float = 300.0,
        stop_timeout: float = 300.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("trigger_rule", TriggerRule.NONE_FAILED)
        super().__init__(**kwargs)
        self.snapshot_summaries = snapshot_summaries
        self.stream_mode = stream_mode
        self.trigger_seconds = trigger_seconds
        self.readers = readers
        self.max_bytes_per_trigger = max_bytes_per_trigger
        self.apply_memory_mb = apply_memory_mb
        self.apply_threads = apply_threads
        self.apply_processes = apply_processes
        self.deletion_vectors = deletion_vectors
        self.schema_change_policy = schema_change_policy
        self.maintenance_interval_seconds = maintenance_interval_seconds
        self.vacuum_retention_hours = vacuum_retention_hours
        self.rewrite_below_mb = rewrite_below_mb
        self.small_table_retention_seconds = small_table_retention_seconds
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._store: Any = None

    def stream_args(self, run_id: str) -> list[str]:
        """The stream job's arguments (``jobs/stream.py``)."""
        args = [
            "--state-root", str(self.state_root),
            "--pipeline-id", str(self.pipeline_id),
            "--sink-root", str(self.sink_root),
            "--run-id", run_id,
            "--trigger-seconds", str(self.trigger_seconds),
        ]  # fmt: skip
        if self.readers:
            args += ["--readers", str(int(self.readers))]
        if self.max_bytes_per_trigger:
            args += ["--max-bytes-per-trigger", str(int(self.max_bytes_per_trigger))]
        if self.apply_memory_mb:
            args += ["--apply-memory-mb", str(int(self.apply_memory_mb))]
        if self.apply_threads:
            args += ["--apply-threads", str(int(self.apply_threads))]
        if self.apply_processes is not None:
            args += ["--apply-processes", str(int(self.apply_processes))]
        if not self.deletion_vectors:
            args.append("--no-deletion-vectors")
        if self.schema_change_policy:
            args += ["--schema-change-policy", check_policy(str(self.schema_change_policy))]
        if self.maintenance_interval_seconds is not None:
            args += ["--maintenance-interval", str(float(self.maintenance_interval_seconds))]
        if self.vacuum_retention_hours is not None:
            args += ["--vacuum-retention-hours", str(float(self.vacuum_retention_hours))]
        args += self._small_table_args()
        return args

    def _small_table_args(self) -> list[str]:
        """``--rewrite-below-mb`` / ``--small-table-retention-seconds``, checked before anything is
        launched (``ValueError`` naming the setting and the fix)."""
        from airflow_provider_mysqlcdc.stream.options import StreamOptions, check_small_tables

        d = StreamOptions()
        below = d.rewrite_below_mb if self.rewrite_below_mb is None else _number(self.rewrite_below_mb, int)
        keep = self.small_table_retention_seconds
        keep = None if keep is None else _number(keep, float)
        hours = d.maintenance.retention_hours if self.vacuum_retention_hours is None else _number(
            self.vacuum_retention_hours, float)  # fmt: skip
        check_small_tables(below, keep, hours, self.apply_memory_mb or d.apply_memory_mb)
        out = [] if self.rewrite_below_mb is None else ["--rewrite-below-mb", str(below)]
        if self.small_table_retention_seconds is not None:
            out += ["--small-table-retention-seconds", str(keep)]
        return out

    def _pipeline_config(self, store: Any, plan_id: str) -> str:
        """The plan's pipeline config decides; returns its ``startup_mode``. ``sink_root``, when
        given too, must be the plan's: a second copy must not point the stream at another lake."""
        from airflow.sdk.exceptions import AirflowFailException

        record = store.read_plan_record(plan_id)
        planned = record.sink_root
        if self.sink_root and planned and str(self.sink_root).rstrip("/") != str(planned).rstrip("/"):
            raise AirflowFailException(
                f"sink_root {self.sink_root!r} is not the plan's {planned!r}: leave sink_root out, the plan has it"
            )
        self.sink_root = self.sink_root or planned
        if not self.sink_root:
            raise AirflowFailException(f"plan {plan_id} names no sink_root: pass sink_root")
        # The plan reserved the first stream_readers ids of server_id_range for the stream's decoders
        # (core/server_ids.py): more would take ids of snapshot groups running beside the stream.
        if self.readers and int(self.readers) > record.stream_readers:
            raise AirflowFailException(
                f"readers={self.readers} exceeds the plan's stream_readers={record.stream_readers}, the server_ids "
                "reserved for the stream: pass stream_readers to the plan operator as well (or lower readers)"
            )
        self.readers = int(self.readers or record.stream_readers)
        return record.startup_mode

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from airflow_provider_mysqlcdc.core.manifest import ManifestError
        from airflow_provider_mysqlcdc.core.stream_state import RunRecord
        from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook
        from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError
        from airflow_provider_mysqlcdc.pipeline import PipelineStateError, finalize_run
        from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
        from airflow_provider_mysqlcdc.stream.control import (
            STOP_REQUEST,
            checkpoint_offset,
            request_stop,
            stream_state,
        )

        if self.stream_mode not in STREAM_MODES:
            raise AirflowFailException(f"stream_mode {self.stream_mode!r} is not one of {list(STREAM_MODES)}")
        store = self._store = self.state_store()
        pointer = store.read_plan_pointer()
        plan_id = self.plan_id or (None if pointer is None else pointer.plan_id)
        if not plan_id or str(plan_id) == "None":
            raise AirflowFailException("no plan id: pass plan_id=plan.output['plan_id'] from MySqlCdcPlanOperator")
        startup_mode = self._pipeline_config(store, str(plan_id))
        summaries = None
        if self.snapshot_summaries is not None:
            summaries = [s for s in _materialize(self.snapshot_summaries) if s]
            self.log.info(
                "snapshot summaries from %d mapped task(s): %d chunks, %d rows",
                len(summaries), sum(s["chunks"] for s in summaries), sum(s["rows"] for s in summaries),
            )
        try:
            sink = DeltaSink(str(self.sink_root), store.storage, owner=self.pipeline_id)
            settings = MySqlCdcHook(self.mysql_cdc_conn_id).settings  # a changelog's re-read reads the binlog
            outcome = finalize_run(store, sink, str(plan_id), summaries, self.stop_timeout, settings)
        except (ManifestError, PipelineStateError) as exc:
            raise AirflowFailException(str(exc)) from None
        manifest = store.read_manifest()
        result: dict[str, Any] = {"pipeline_id": self.pipeline_id, "plan": outcome.to_dict(), "launched": False}
        if manifest is None:
            raise AirflowFailException("the pipeline captures no table yet: nothing to stream")
        self._lineage_tables = sorted(manifest.tables)
        if startup_mode == "snapshot-only":
            self.log.info("startup_mode snapshot-only: manifest recorded, no stream started")
            return result

        st = stream_state(store)
        if st["running"]:
            if outcome.reloaded:
                self.log.info("the stream (run %s) was paused for the hand-over and runs on with the new manifest",
                              st["run_id"])  # fmt: skip
                return {**result, "running": True, "run_id": st["run_id"], "reloaded": True}
            if not outcome.added and not outcome.resnapshotted:
                self.log.info("the stream (run %s) already runs with this manifest: left running", st["run_id"])
                return {**result, "running": True, "run_id": st["run_id"], "already_running": True}
            self.log.info("the stream runs with an older manifest: stopping it to restart with the new one")
            request_stop(store, timeout=self.stop_timeout)
        elif st["state"] in ("failed", "lost"):
            self.log.warning("the stream had %s: %s — restarting it from its checkpoint", st["state"], st["reason"])

        ckpt = checkpoint_offset(store)
        start = ckpt or manifest.start_offset
        try:
            MySqlCdcHook(self.mysql_cdc_conn_id).ensure_offset_available(start)
        except BinlogUnavailableError as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info(
            "starting the stream of %s from %s (%s)", sorted(manifest.tables), start,
            "its checkpoint" if ckpt else (
                f"generation {outcome.new_generation}: the earliest new high watermark"
                if outcome.new_generation else "the snapshot's minimum high watermark"
            ),
        )
        run_id = uuid.uuid4().hex[:12]
        self.application = self.application or job_path("stream")
        self.application_args = self.stream_args(run_id)
        self.name = self.name or f"mysqlcdc-stream-{self.pipeline_id}"
        store.delete(STOP_REQUEST)
        result.update({"run_id": run_id, "start_offset": start.to_dict(), "from_checkpoint": ckpt is not None})
        if self.stream_mode == "attached":
            self.log.info("attached: this task runs the stream until it is stopped")
            super().execute(context)
            run = store.read_run() or RunRecord()
            if run.run_id == run_id and run.state == "failed":
                raise AirflowException(f"the stream failed: {run.error}")
            return {**result, "launched": True, "final_state": run.state, "committed": run.committed_offset}
        return {**result, **self._launch_detached(store, run_id)}

    def _launch_detached(self, store: Any, run_id: str) -> dict[str, Any]:
        """Submit the stream detached and wait until it reports running; its handle."""
        from airflow.sdk.exceptions import AirflowException

        from airflow_provider_mysqlcdc.stream.launcher import (
            StreamLaunchError,
            log_path_for,
            record_detached,
            wait_until_running,
        )

        log_path = log_path_for(store, run_id)
        hook = self._hook = self._get_hook(detach_log=log_path)
        hook.submit(self.application)
        assert hook.process is not None
        extra = {"master": hook.master, "deploy_mode": "cluster" if hook.cluster_deploy_mode else "client"}
        handle = record_detached(store, hook.process, run_id, log_path, extra)
        proc = handle.pop("_proc")
        try:
            run = wait_until_running(store, run_id, proc, log_path, self.start_timeout,
                                     submit_only=hook.cluster_deploy_mode)  # fmt: skip
        except StreamLaunchError as exc:
            raise AirflowException(str(exc)) from None
        self.log.info("the stream runs: run %s, driver pid %s on %s; log %s", run_id, run["pid"], run["host"],
                      log_path)  # fmt: skip
        return {**handle, "launched": True, "running": True, "driver_pid": run["pid"]}

    def on_kill(self) -> None:
        """Attached mode: stop the stream after its running batch, then the parent makes sure spark-submit
        is gone. A detached stream outlives its task by design: left running."""
        from airflow_provider_mysqlcdc.stream.control import request_stop

        if self.stream_mode != "attached":
            return
        if self._store is not None:
            try:
                request_stop(self._store, timeout=min(self.stop_timeout, 120.0))
            except Exception as exc:
                self.log.warning("graceful stop failed (%s): killing spark-submit", exc)
        if self._hook is not None:
            super().on_kill()


def _number(value: Any, kind: type) -> Any:
    """A rendered template's number as ``kind`` (a DAG param arrives as a string without native
    rendering); anything else is returned as it is, for the check to refuse by name."""
    if isinstance(value, str):
        try:
            return kind(float(value)) if kind is int and float(value).is_integer() else kind(value)
        except ValueError:
            return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _materialize(values: Any) -> list[Any]:
    """The mapped tasks' XComs as a list. Airflow's lazy sequence finds its end by probing one past
    it, which logs an alarming "XCom not found" error; its length is known, so index instead."""
    try:
        n = len(values)
    except TypeError:
        return list(values)
    return [values[i] for i in range(n)]


class MySqlCdcStopStreamOperator(BaseOperator):
    """Stop a pipeline's stream gracefully: after its running micro-batch, checkpoint intact.

    Works for detached streams on any host (the request travels through the state store); if
    the stream does not confirm within ``timeout`` and runs on this host it is terminated — the
    checkpoint and the sink's per-batch transaction ids make that safe too. Returns the final
    state (committed offset, last batch). A stream that is not running is not an error; a pipeline
    the state root does not hold (a typo'd id or root) is, naming the pipelines it holds.

    ``refuse_unknown_conf`` (default True): a DAG run conf key that is not a param of the DAG fails
    the task, naming the closest param — a typo must not stop the default pipeline.
    """

    template_fields: Sequence[str] = ("pipeline_id", "state_root", "storage_conn_id")

    def __init__(
        self,
        *,
        pipeline_id: str,
        state_root: str,
        timeout: float = 300.0,
        storage_conn_id: str | None = None,
        refuse_unknown_conf: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_id = pipeline_id
        self.state_root = state_root
        self.timeout = timeout
        self.storage_conn_id = storage_conn_id or None
        self.refuse_unknown_conf = refuse_unknown_conf

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from airflow_provider_mysqlcdc.hooks.object_storage import lake_storage
        from airflow_provider_mysqlcdc.operators._conf import refuse_unknown_conf_keys
        from airflow_provider_mysqlcdc.state import StateStore, unknown_pipeline_problem
        from airflow_provider_mysqlcdc.stream.control import request_stop

        if self.refuse_unknown_conf:
            refuse_unknown_conf_keys(self, context)
        store = StateStore(self.state_root, self.pipeline_id, lake_storage(self.storage_conn_id))
        problem = unknown_pipeline_problem(store)
        if problem:  # a typo'd pipeline id must not read as "stopped"
            raise AirflowFailException(problem)
        out = request_stop(store, timeout=self.timeout)
        self.log.info(
            "stream %s: %s (committed offset %s)", self.pipeline_id,
            "stopped" if out["stopped"] else "was not running", out["committed_offset"],
        )
        return out
