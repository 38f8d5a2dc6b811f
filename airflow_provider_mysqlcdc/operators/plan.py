"""``MySqlCdcPlanOperator``: check the source, decide what to snapshot, split it, return the groups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_mysqlcdc.core.chunk import DEFAULT_CHUNK_SIZE
from airflow_provider_mysqlcdc.core.config import DEFAULT_CHUNKS_PER_TASK, PipelineConfig, PipelineConfigError
from airflow_provider_mysqlcdc.core.server_ids import DEFAULT_MAX_PARALLEL_GROUPS, DEFAULT_STREAM_READERS
from airflow_provider_mysqlcdc.operators._conf import refuse_unknown_conf_keys


class MySqlCdcPlanOperator(BaseOperator):
    r"""Plan one run of a CDC pipeline; returns one small descriptor per chunk group, for mapping.

    The descriptors (``{"pipeline_id", "state_root", "sink_root", "plan_id", "group_id",
    "group_label"}``) feed ``MySqlCdcSnapshotOperator.partial(...).expand_kwargs(plan.output)``: the
    plan is the one source of the pipeline's config, so the snapshot tasks need no copy of it. The
    plan itself (tables, schemas, chunk boundaries, the validated config such as ``skip_backfill``
    and ``startup_mode``) goes to the state store, never to XCom; the operators downstream read it
    there. The plan id is also pushed under the XCom key ``plan_id`` (``plan.output["plan_id"]``)
    for the stream operator.

    Tables already captured by the pipeline are not re-read; new tables are snapshotted (or, with
    ``startup_mode`` ``latest-offset`` / ``specific-offset``, start at an offset);
    ``resnapshot_tables`` are re-snapshotted (staged, then swapped in whole). New and re-snapshotted
    tables are read while the stream runs on; the stream operator hands them over
    (``pipeline.finalize_run``: the stream pauses for a few seconds, it is not restarted).

    Bad parameters, a sink or state root that cannot be written (a probe object is written and
    removed under each), and a source that is not ready (binlog off, STATEMENT format, missing
    privilege, unknown table, no primary key...) fail the task at once, with no retry, before any
    Spark job starts; the message names the fix.

    :param pipeline_id: names the pipeline's directory in the state store (and its stream)
    :param sink_root: where the Delta tables go (``<sink_root>/<db>/<table>``)
    :param state_root: the state store: a local directory, or an fsspec URL shared by all workers
    :param tables: ``<database>.<table>`` names or patterns to capture (``shop.*``)
    :param exclude_tables: names or patterns to leave out of what ``tables`` selects
    :param chunk_size: rows per chunk (the unit of the watermark-bracketed read)
    :param chunks_per_task: chunks per chunk group, i.e. per mapped snapshot task / Spark application
    :param startup_mode: ``initial`` (snapshot + stream), ``snapshot-only``, ``latest-offset``,
        ``specific-offset`` (new tables start at ``specific_offset`` with no snapshot),
        ``earliest-offset`` (the oldest binlog the source keeps) or ``timestamp`` (the first
        transaction at or after ``startup_timestamp``)
    :param specific_offset: ``{"file": "mysql-bin.000042", "pos": 4}`` for ``specific-offset``
    :param startup_timestamp: ISO 8601 time (no zone = UTC) or epoch seconds, for ``timestamp``
    :param resnapshot_tables: captured tables to re-snapshot (``backfill_tables`` is the deprecated
        old name, still accepted)
    :param repair_chunks: ``{"db.t": [chunk numbers]}``, what ``verify`` reports: only those chunks
        are read again and swapped in, while the stream runs
    :param recover_purged: when the stream's restart offset was purged from the source, re-snapshot
        every captured table and restart the stream from those snapshots (without it, the plan
        fails naming the lost offset)
    :param snapshot_filters: ``{"db.t": "<SQL condition>"}``: a partial backfill of a captured
        table — only the rows the condition selects are read again and swapped in, while the stream
        runs; every other row of the table stays as it is
    :param max_rows_per_second: the most rows per second the snapshot reads from the source, over
        all its tasks (None or 0: unlimited); shared by ``max_parallel_groups`` groups
    :param changelog_tables: names or patterns of captured tables that also get a changelog table
        (every change with before/after images and binlog position, snapshot rows as op ``r``;
        docs/architecture.md, "Changelog")
    :param metadata_columns: the mirror tables get ``_op``, ``_commit_ts``, ``_binlog_file`` and
        ``_binlog_pos`` (the event that last wrote each row); fixed per table when first captured
    :param routes: ``[{"source": pattern, "target": "db.table"}]``: the selected tables a pattern
        matches (shards such as ``db_[0-9]+\.orders_[0-9]+``) share the Delta table ``target``, with
        ``_source_database`` and ``_source_table`` columns that join the key; shards whose schemas
        differ are refused naming the columns (docs/architecture.md, "Routing sharded tables")
    :param chunk_key_columns: per table, chunk key columns other than the primary key (tables
        without a primary key need one)
    :param takeover_tables: tables whose Delta table another pipeline owns, to take over (they are
        re-snapshotted by this pipeline; the other pipeline's stream then refuses to write them)
    :param allow_large_plan: allow a chunk size below 100 rows or more than 10,000 chunks per table
    :param stream_readers: the stream's binlog decoders (the stream operator's ``readers`` defaults to
        it and may not exceed it): they take the first ids of the connection's ``server_id_range``
    :param max_parallel_groups: how many snapshot groups run at once (set the mapped snapshot task's
        ``max_active_tis_per_dagrun`` to it). The plan refuses a ``server_id_range`` smaller than
        ``stream_readers + max_parallel_groups``, naming the size needed (docs/architecture.md,
        "Replication server_ids")
    :param mysql_cdc_conn_id: the source connection (type ``mysql_cdc``; templated: the example DAG's
        ``source_conn_id`` param); passed on to the snapshot tasks in their descriptors
    :param storage_conn_id: the connection with the object-store credentials of ``sink_root`` and
        ``state_root`` (e.g. ``aws_default``: ``hooks/object_storage.py``); passed on to the
        snapshot tasks in their descriptors. Unset for a local lake or the machine's credentials
    :param stop_timeout: seconds to wait for a running stream to stop gracefully
    :param refuse_unknown_conf: fail the task when the DAG run's conf has a key that is not a param of
        the DAG (a typo such as ``tabels`` would otherwise run the param's default), naming the closest
        param; set False in a DAG whose other tasks read conf keys of their own
    """

    template_fields: Sequence[str] = (
        "pipeline_id",
        "sink_root",
        "state_root",
        "tables",
        "exclude_tables",
        "chunk_size",
        "chunks_per_task",
        "startup_mode",
        "specific_offset",
        "startup_timestamp",
        "resnapshot_tables",
        "repair_chunks",
        "recover_purged",
        "snapshot_filters",
        "max_rows_per_second",
        "changelog_tables",
        "metadata_columns",
        "routes",
        "backfill_tables",
        "skip_backfill",
        "chunk_key_columns",
        "takeover_tables",
        "allow_large_plan",
        "storage_conn_id",
        "mysql_cdc_conn_id",
        "stream_readers",
        "max_parallel_groups",
    )
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        pipeline_id: str,
        sink_root: str,
        state_root: str,
        tables: list[str] | str,
        exclude_tables: list[str] | str | None = None,
        chunk_size: int | str = DEFAULT_CHUNK_SIZE,
        chunks_per_task: int | str = DEFAULT_CHUNKS_PER_TASK,
        startup_mode: str = "initial",
        specific_offset: dict[str, Any] | str | None = None,
        startup_timestamp: str | float | None = None,
        resnapshot_tables: list[str] | str | None = None,
        repair_chunks: dict[str, list[int]] | str | None = None,
        recover_purged: bool | str = False,
        snapshot_filters: dict[str, str] | str | None = None,
        max_rows_per_second: int | str | None = None,
        changelog_tables: list[str] | str | None = None,
        metadata_columns: bool | str = False,
        routes: list[dict[str, str]] | str | None = None,
        backfill_tables: list[str] | str | None = None,
        skip_backfill: bool | str = False,
        chunk_key_columns: dict[str, list[str]] | str | None = None,
        takeover_tables: list[str] | str | None = None,
        allow_large_plan: bool | str = False,
        stream_readers: int | str = DEFAULT_STREAM_READERS,
        max_parallel_groups: int | str = DEFAULT_MAX_PARALLEL_GROUPS,
        mysql_cdc_conn_id: str = "mysql_cdc_default",
        storage_conn_id: str | None = None,
        stop_timeout: float = 300.0,
        refuse_unknown_conf: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_id = pipeline_id
        self.sink_root = sink_root
        self.state_root = state_root
        self.tables = tables
        self.exclude_tables = exclude_tables
        self.chunk_size = chunk_size
        self.chunks_per_task = chunks_per_task
        self.startup_mode = startup_mode
        self.specific_offset = specific_offset
        self.startup_timestamp = startup_timestamp
        self.resnapshot_tables = resnapshot_tables
        self.repair_chunks = repair_chunks
        self.recover_purged = recover_purged
        self.snapshot_filters = snapshot_filters
        self.max_rows_per_second = max_rows_per_second
        self.changelog_tables = changelog_tables
        self.metadata_columns = metadata_columns
        self.routes = routes
        self.backfill_tables = backfill_tables
        self.skip_backfill = skip_backfill
        self.chunk_key_columns = chunk_key_columns
        self.takeover_tables = takeover_tables
        self.allow_large_plan = allow_large_plan
        self.stream_readers = stream_readers
        self.max_parallel_groups = max_parallel_groups
        self.mysql_cdc_conn_id = mysql_cdc_conn_id
        self.storage_conn_id = storage_conn_id or None
        self.stop_timeout = stop_timeout
        self.refuse_unknown_conf = refuse_unknown_conf

    def config(self) -> PipelineConfig:
        return PipelineConfig.from_params(
            pipeline_id=self.pipeline_id,
            sink_root=self.sink_root,
            state_root=self.state_root,
            tables=self.tables,
            exclude_tables=self.exclude_tables,
            chunk_size=self.chunk_size,
            chunks_per_task=self.chunks_per_task,
            startup_mode=self.startup_mode,
            specific_offset=self.specific_offset,
            startup_timestamp=self.startup_timestamp,
            resnapshot_tables=self.resnapshot_tables,
            repair_chunks=self.repair_chunks,
            recover_purged=self.recover_purged,
            snapshot_filters=self.snapshot_filters,
            max_rows_per_second=self.max_rows_per_second,
            changelog_tables=self.changelog_tables,
            metadata_columns=self.metadata_columns,
            routes=self.routes,
            backfill_tables=self.backfill_tables,
            skip_backfill=self.skip_backfill,
            chunk_key_columns=self.chunk_key_columns,
            takeover_tables=self.takeover_tables,
            allow_large_plan=self.allow_large_plan,
            stream_readers=self.stream_readers,
            max_parallel_groups=self.max_parallel_groups,
        )

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from airflow.sdk.exceptions import AirflowFailException

        from airflow_provider_mysqlcdc.core.table import SourceSchemaError
        from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook
        from airflow_provider_mysqlcdc.hooks.object_storage import ObjectStorageError, given_conn_id, lake_storage
        from airflow_provider_mysqlcdc.mysql.checks import SourceCheckError
        from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError
        from airflow_provider_mysqlcdc.pipeline import PipelineStateError, new_plan_id, plan_run
        from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
        from airflow_provider_mysqlcdc.state import StateStore
        from airflow_provider_mysqlcdc.storage import root_problem

        if self.refuse_unknown_conf:
            refuse_unknown_conf_keys(self, context)
        try:
            config = self.config()
        except PipelineConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info(
            "pipeline %s: source connection %s, tables %s%s, startup_mode %s, re-snapshot %s, chunk_size %d, "
            "chunks_per_task %d", config.pipeline_id, self.mysql_cdc_conn_id, config.tables,
            f" excluding {config.exclude_tables}" if config.exclude_tables else "", config.startup_mode,
            config.resnapshot_tables or "none", config.chunk_size, config.chunks_per_task,
        )
        try:
            storage = lake_storage(self.storage_conn_id)
        except ObjectStorageError as exc:
            raise AirflowFailException(str(exc)) from None
        # The source is checked below; the lake is checked here, before it, or a root that cannot be
        # written would pass the plan and fail only inside a Spark job.
        problems = [p for p in (root_problem(storage, "sink_root", config.sink_root),
                                root_problem(storage, "state_root", config.state_root)) if p]  # fmt: skip
        if problems:
            raise AirflowFailException("\n".join(problems))
        store = StateStore(config.state_root, config.pipeline_id, storage)
        sink = DeltaSink(config.sink_root, storage, owner=config.pipeline_id, routes=config.routing)
        run_id = context.get("run_id") if context else None
        plan_id = new_plan_id(run_id)
        hook = MySqlCdcHook(self.mysql_cdc_conn_id)
        try:
            with hook.connection() as conn:
                outcome = plan_run(conn, store, config, plan_id, sink.exists, self.stop_timeout,
                                   table_owner=sink.owner_of, airflow_run_id=run_id,
                                   server_id_range=hook.settings.server_id_range,
                                   binlog_settings=hook.settings)  # fmt: skip
        except (SourceCheckError, SourceSchemaError, BinlogUnavailableError, PipelineStateError) as exc:
            raise AirflowFailException(str(exc)) from None
        # plan_run has logged each note (skipped tables, deprecations...) and the selection once: the
        # summary here leaves them out (they are in the plan_summary XCom)
        brief = {k: v for k, v in outcome.to_dict().items() if k not in ("notes", "selected_tables")}
        self.log.info("plan %s: %s", plan_id, brief)
        self.log.info("%s", outcome.describe(config.pipeline_id))
        ti = context["ti"]
        ti.xcom_push(key="plan_id", value=plan_id)
        ti.xcom_push(key="plan_summary", value=outcome.to_dict())
        where = {"pipeline_id": config.pipeline_id, "state_root": config.state_root, "sink_root": config.sink_root,
                 "mysql_cdc_conn_id": self.mysql_cdc_conn_id}  # fmt: skip
        if given_conn_id(self.storage_conn_id):  # the id, never the keys: descriptors are XComs
            where["storage_conn_id"] = given_conn_id(self.storage_conn_id)
        return [{**where, **g} for g in outcome.groups]
