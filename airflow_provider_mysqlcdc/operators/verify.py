"""``MySqlCdcVerifyOperator``: prove the lake equals the source, chunk by chunk, with the stream running."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator


class MySqlCdcVerifyOperator(BaseOperator):
    """Compare every captured table (or ``tables``) of the source with its Delta table.

    Per chunk of the snapshot plan, the server computes the row count and a digest of every
    value over the chunk's key range inside one consistent snapshot; the task waits until the
    stream has applied the source up to that point, computes the same over the Delta table, and
    leaves out the rows that changed meanwhile (they are counted as in flight). The task fails and
    names each differing table and chunk key range, and the ``repair_chunks`` param that re-snapshots
    exactly those chunks while the stream runs. It runs on the Airflow worker: pymysql and delta-rs, no Spark. One
    scan of each table per side (docs/architecture.md, "Verify"; cost in bench/RESULTS.md).

    :param pipeline_id: the pipeline whose captured tables are compared
    :param state_root: the pipeline's state store (the manifest and the stream's checkpoint)
    :param sink_root: where the Delta tables are
    :param tables: captured tables to compare (default: all of them)
    :param enabled: False skips the task (the example DAG's ``verify`` param)
    :param wait_timeout: seconds to wait for a running stream to reach the source's position (a stream
        that is not running fails the task at once, naming the fix)
    :param fail_on_difference: False records the report (XCom) without failing the task
    :param mysql_cdc_conn_id: the source connection (``mysql_cdc`` type)
    :param storage_conn_id: connection with the object-store credentials of the roots
    """

    template_fields: Sequence[str] = (
        "pipeline_id", "state_root", "sink_root", "tables", "enabled", "mysql_cdc_conn_id", "storage_conn_id",
    )  # fmt: skip
    ui_color = "#fdf3e8"

    def __init__(
        self,
        *,
        pipeline_id: str,
        state_root: str,
        sink_root: str,
        tables: list[str] | str | None = None,
        enabled: bool | str = True,
        wait_timeout: float = 600.0,
        fail_on_difference: bool = True,
        mysql_cdc_conn_id: str = "mysql_cdc_default",
        storage_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_id = pipeline_id
        self.state_root = state_root
        self.sink_root = sink_root
        self.tables = tables
        self.enabled = enabled
        self.wait_timeout = wait_timeout
        self.fail_on_difference = fail_on_difference
        self.mysql_cdc_conn_id = mysql_cdc_conn_id
        self.storage_conn_id = storage_conn_id or None

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook
        from airflow_provider_mysqlcdc.hooks.object_storage import ObjectStorageError, lake_storage
        from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
        from airflow_provider_mysqlcdc.state import StateStore
        from airflow_provider_mysqlcdc.verify import VerifyError, verify_pipeline

        if str(self.enabled).strip().lower() in ("false", "0", "no", "", "none"):
            raise AirflowSkipException("verify is off for this run (enable it with the verify param)")
        tables = self.tables
        if isinstance(tables, str):
            tables = [t.strip(" '\"") for t in tables.strip("[]").split(",") if t.strip(" '\"")]
        try:
            storage = lake_storage(self.storage_conn_id)
        except ObjectStorageError as exc:
            raise AirflowFailException(str(exc)) from None
        store = StateStore(self.state_root, self.pipeline_id, storage)
        sink = DeltaSink(self.sink_root, storage)
        settings = MySqlCdcHook(self.mysql_cdc_conn_id).settings
        try:
            report = verify_pipeline(settings, store, sink, tables or None, wait_timeout=self.wait_timeout,
                                     progress=self.log.info)  # fmt: skip
        except VerifyError as exc:  # a stream that is not running, nothing captured: a retry cannot help
            raise AirflowFailException(str(exc)) from None
        for line in report.summary().splitlines():
            self.log.info("%s", line)
        if not report.ok and self.fail_on_difference:
            raise AirflowFailException(report.summary())
        return report.to_dict()
