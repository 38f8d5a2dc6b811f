"""``MySqlCdcSnapshotOperator``: one chunk group = one mapped task = one Spark application."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_mysqlcdc.operators._spark import MySqlCdcSparkSubmitOperator, job_path

READERS = ("auto", "native", "jdbc")


class MySqlCdcSnapshotOperator(MySqlCdcSparkSubmitOperator):
    """Snapshot one chunk group with the watermark-bracketed read, through ``spark-submit``.

    Map it over the plan's group descriptors, which carry the pipeline's ids and roots::

        snapshot = MySqlCdcSnapshotOperator.partial(
            task_id="snapshot", map_index_template="{{ task.group_label }}",
        ).expand_kwargs(plan.output)

    The Spark job (``jobs/snapshot.py`` of this package unless ``application`` says otherwise)
    reads the group's chunks in parallel Spark tasks, corrects them with the binlog window (unless
    the plan says ``skip_backfill``) and commits them to the sink; its chunk results go to the
    state store (spark-submit returns no XCom in local mode), and this operator returns a small
    summary read from there: group id, tables, chunks, rows, seconds, rows/s, low and high watermark.

    Retries are idempotent: a re-run replaces whatever an earlier attempt of the group wrote.
    ``on_kill`` (task cleared or timed out) kills the Spark application (the parent's).

    :param group_id: the chunk group of the plan to read
    :param group_label: how the mapped task shows in the UI (``map_index_template``), short: ``group 3: 12
        tables, 40 chunks``
    :param group_chunks: each table of the group with its chunks (``shop.orders chunks 0–63, ...``): a
        template field, so the task's *Rendered Templates* show it
    :param fetch_size: JDBC fetch size of the chunk reads
    :param reader: chunk reader: ``auto`` (default: the native Arrow reader, connectorx, where it
        reads the table exactly, else Spark JDBC), ``native`` (fail if it cannot) or ``jdbc``
    :param window_memory_mb: memory the group may use to fold its binlog window; a window holding a
        larger transaction is folded in buckets spilled to local disk (default 512)
    :param kwargs: the CDC arguments of :class:`MySqlCdcSparkSubmitOperator` (``pipeline_id``,
        ``state_root``, ``sink_root``, ``plan_id``, ``mysql_cdc_conn_id``) and every argument of
        ``SparkSubmitOperator``
    """

    template_fields: Sequence[str] = (
        *MySqlCdcSparkSubmitOperator.template_fields, "group_id", "reader", "group_chunks",
    )  # fmt: skip
    ui_color = "#fdf1e1"

    def __init__(
        self,
        *,
        group_id: int,
        group_label: str | None = None,
        group_chunks: str | None = None,
        fetch_size: int = 10_000,
        reader: str = "auto",
        window_memory_mb: int = 512,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.group_id = group_id
        self.group_label = group_label or f"group {group_id}"
        self.group_chunks = group_chunks or ""
        self.fetch_size = fetch_size
        self.reader = reader
        self.window_memory_mb = window_memory_mb

    def snapshot_args(self, skip_backfill: bool) -> list[str]:
        """The snapshot job's arguments (``jobs/snapshot.py``)."""
        args = [
            "--state-root", str(self.state_root),
            "--pipeline-id", str(self.pipeline_id),
            "--plan-id", str(self.plan_id),
            "--group-id", str(int(self.group_id)),
            "--sink-root", str(self.sink_root),
            "--fetch-size", str(int(self.fetch_size)),
            "--reader", str(self.reader),
            "--window-memory-mb", str(int(self.window_memory_mb)),
        ]  # fmt: skip
        return [*args, "--skip-backfill"] if skip_backfill else args

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        if self.reader not in READERS:
            raise AirflowFailException(f"reader must be 'auto', 'native' or 'jdbc', got {self.reader!r}")
        if not self.sink_root or not self.plan_id:
            raise AirflowFailException("sink_root and plan_id are needed: map the operator over plan.output")
        store = self.state_store()
        group_id = int(self.group_id)
        plan = store.read_plan_record(str(self.plan_id))
        self.application = self.application or job_path("snapshot")
        self.application_args = self.snapshot_args(plan.skip_backfill)  # the plan decides
        self.name = self.name or f"mysqlcdc-snapshot-{self.pipeline_id}-g{group_id}"
        self.log.info("snapshot group %d of plan %s: %s", group_id, self.plan_id, self.group_chunks or self.group_label)
        store.clear_group_error(str(self.plan_id), group_id)
        try:
            super().execute(context)
        except AirflowException:
            err = store.read_group_error(str(self.plan_id), group_id)
            if err:  # the job's own one-line explanation beats spark-submit's exit code
                msg = f"snapshot group {group_id} ({self.group_label}) failed: {err['error']}"
                raise AirflowException(msg) from None
            raise
        res = store.read_group_report(str(self.plan_id), group_id)
        if res is None:
            raise AirflowException(
                f"the snapshot job of group {group_id} exited 0 but left no results in the state store "
                f"({store.url('plans', str(self.plan_id), 'results')}): is state_root shared with the Spark driver?"
            )
        summary = _summary(str(self.plan_id), group_id, self.group_label, res)
        self._lineage_tables = list(summary["tables"])
        self.log.info(
            "group %d: %d chunks, %d rows in %.1fs (%.0f rows/s), HW %s",
            group_id, summary["chunks"], summary["rows"], summary["seconds"], summary["rows_per_s"],
            summary["max_hw"],
        )
        return summary


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
