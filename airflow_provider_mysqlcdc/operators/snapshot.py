"""``MySqlCdcSnapshotOperator``: one split group = one mapped task = one Spark application."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator


class MySqlCdcSnapshotOperator(BaseOperator):
    """Snapshot one split group with the watermark-bracketed read, through ``spark-submit``.

    Map it over the plan's groups::

        snapshot = MySqlCdcSnapshotOperator.partial(
            task_id="snapshot", pipeline_id=..., sink_root=..., state_root=...,
            map_index_template="{{ task.group_label }}",
        ).expand_kwargs(plan.output)

    The Spark job (``jobs/snapshot.py`` of this package unless ``application`` says otherwise)
    reads the group's chunks in parallel Spark tasks, corrects them with the binlog window and
    commits them to the sink; its chunk results go to the state store (spark-submit returns no
    XCom in local mode), and this operator returns a small summary read from there: group id,
    tables, chunks, rows, seconds, rows/s, low and high watermark.

    Retries are idempotent: a re-run replaces whatever an earlier attempt of the group wrote.
    ``on_kill`` (task cleared or timed out) kills the Spark application.

    :param spark_conn_id: where Spark runs (``spark_default``: ``local[*]``, ``spark://``, yarn, k8s)
    :param conf: extra Spark configuration
    :param jars: the JDBC driver jar (default: Debian's MariaDB Connector/J)
    :param application: the snapshot job's path if the cluster needs another (e.g. on HDFS/S3)
    :param fetch_size: JDBC fetch size of the chunk reads
    :param reader: chunk reader: ``auto`` (default: the native Arrow reader, connectorx, where it
        reads the table exactly, else Spark JDBC), ``native`` (fail if it cannot) or ``jdbc``
    :param window_memory_mb: memory the group may use to fold its binlog window; a window holding a
        larger transaction is folded in buckets spilled to local disk (default 512)
    """

    template_fields: Sequence[str] = (
        "pipeline_id",
        "sink_root",
        "state_root",
        "plan_id",
        "group_id",
        "conf",
        "skip_backfill",
        "application",
        "reader",
    )
    template_fields_renderers = {"conf": "json"}
    ui_color = "#fdf1e1"

    def __init__(
        self,
        *,
        pipeline_id: str,
        sink_root: str,
        state_root: str,
        plan_id: str,
        group_id: int,
        group_label: str | None = None,
        skip_backfill: bool | str = False,
        mysql_cdc_conn_id: str = "mysql_cdc_default",
        spark_conn_id: str = "spark_default",
        conf: dict[str, Any] | None = None,
        jars: str | None = None,
        application: str | None = None,
        driver_memory: str | None = None,
        executor_memory: str | None = None,
        num_executors: int | None = None,
        executor_cores: int | None = None,
        py_files: str | None = None,
        fetch_size: int = 10_000,
        reader: str = "auto",
        window_memory_mb: int = 512,
        verbose: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_id = pipeline_id
        self.sink_root = sink_root
        self.state_root = state_root
        self.plan_id = plan_id
        self.group_id = group_id
        self.group_label = group_label or f"group {group_id}"
        self.skip_backfill = skip_backfill
        self.mysql_cdc_conn_id = mysql_cdc_conn_id
        self.spark_conn_id = spark_conn_id
        self.conf = conf
        self.jars = jars
        self.application = application
        self.driver_memory = driver_memory
        self.executor_memory = executor_memory
        self.num_executors = num_executors
        self.executor_cores = executor_cores
        self.py_files = py_files
        self.fetch_size = fetch_size
        self.reader = reader
        self.window_memory_mb = window_memory_mb
        self.verbose = verbose
        self._hook: Any = None

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowException

        from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook
        from airflow_provider_mysqlcdc.operators._spark import build_hook, job_path
        from airflow_provider_mysqlcdc.state import StateStore

        if self.reader not in ("auto", "native", "jdbc"):
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"reader must be 'auto', 'native' or 'jdbc', got {self.reader!r}")
        store = StateStore(self.state_root, self.pipeline_id)
        group_id = int(self.group_id)
        plan = store.read_plan(self.plan_id)
        skip_backfill = str(self.skip_backfill).lower() == "true" or bool(plan.get("skip_backfill"))
        args = [
            "--state-root", self.state_root,
            "--pipeline-id", self.pipeline_id,
            "--plan-id", self.plan_id,
            "--group-id", str(group_id),
            "--sink-root", self.sink_root,
            "--fetch-size", str(int(self.fetch_size)),
            "--reader", str(self.reader),
            "--window-memory-mb", str(int(self.window_memory_mb)),
        ]
        if skip_backfill:
            args.append("--skip-backfill")
        self._hook = build_hook(
            conn_id=self.spark_conn_id,
            settings=MySqlCdcHook(self.mysql_cdc_conn_id).settings,
            name=f"mysqlcdc-snapshot-{self.pipeline_id}-g{group_id}",
            application_args=args,
            conf=self.conf,
            jars=self.jars,
            driver_memory=self.driver_memory,
            executor_memory=self.executor_memory,
            num_executors=self.num_executors,
            executor_cores=self.executor_cores,
            py_files=self.py_files,
            verbose=self.verbose,
        )
        self.log.info("snapshot group %d of plan %s: %s", group_id, self.plan_id, self.group_label)
        store.clear_group_error(self.plan_id, group_id)
        try:
            self._hook.submit(self.application or job_path("snapshot"))
        except AirflowException:
            err = store.read_group_error(self.plan_id, group_id)
            if err:  # the job's own one-line explanation beats spark-submit's exit code
                msg = f"snapshot group {group_id} ({self.group_label}) failed: {err['error']}"
                raise AirflowException(msg) from None
            raise
        res = store.read_group_report(self.plan_id, group_id)
        if res is None:
            raise AirflowException(
                f"the snapshot job of group {group_id} exited 0 but left no results in the state store "
                f"({store.url('plans', self.plan_id, 'results')}): is state_root shared with the Spark driver?"
            )
        summary = _summary(self.plan_id, group_id, self.group_label, res)
        self.log.info(
            "group %d: %d chunks, %d rows in %.1fs (%.0f rows/s), HW %s",
            group_id, summary["chunks"], summary["rows"], summary["seconds"], summary["rows_per_s"],
            summary["max_hw"],
        )
        return summary

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()


def _summary(plan_id: str, group_id: int, label: str, res: Any) -> dict[str, Any]:
    """The XCom summary of a group from its report (a ``core.records.GroupReport``)."""
    chunks = res.chunks
    hws = [c.high_watermark for c in chunks]
    secs = float(res.summary.get("seconds", 0.0))
    rows = int(sum(c.rows for c in chunks))
    return {
        "plan_id": plan_id,
        "group_id": group_id,
        "group_label": label,
        "tables": sorted({c.table for c in chunks}),
        "chunks": len(chunks),
        "rows": rows,
        "seconds": round(secs, 3),
        "rows_per_s": round(rows / secs, 1) if secs > 0 else None,
        "min_hw": min(hws).to_dict() if hws else None,
        "max_hw": max(hws).to_dict() if hws else None,
    }
