"""Example DAGs of airflow-provider-mysqlcdc: copy this file into your dags folder and adapt it.

``mysql_cdc`` captures MySQL/MariaDB tables into Delta Lake:

    plan ─▶ snapshot (mapped: one task per chunk group, one Spark application each)
         ─▶ stream (builds the manifest from the snapshot's high watermarks, launches the binlog stream)
         ─▶ wait_caught_up (deferrable: until the stream has applied everything up to "now")

Trigger it from the UI form or the CLI; every run reconciles the pipeline with its params:

* first run: snapshots ``tables`` and starts the stream; ``tables`` takes names and patterns
  (``shop.*``, ``shop\\.order_[0-9]+``) and ``exclude_tables`` leaves some out — a table created
  later that matches is captured by the next run;
* ``tables`` extended by a new table: snapshots only the new table while the stream keeps the
  others current, then hands it over to the stream (paused for seconds after its running batch,
  resumed with the merged manifest in the same Spark application — from its checkpoint, or as a new
  stream generation from the new table's watermarks);
* ``resnapshot_tables=["db.t"]``: re-snapshots ``db.t`` while the stream runs on, then swaps its
  Delta table in with one commit (``backfill_tables``, the old name, still works);
* nothing new: leaves a running stream alone, or restarts a stopped one from its checkpoint;
* ``verify=true``: ends the run by comparing every captured table with its source, chunk by chunk;
  ``repair_chunks={"db.t": [3]}`` (what it reports) re-snapshots only those chunks, stream running.

``mysql_cdc_stop`` stops a pipeline's stream gracefully. Connections: the source, ``mysql_cdc_default``
(type ``mysql_cdc``; the ``source_conn_id`` param names another, so one DAG serves several sources,
each pipeline with its own ``pipeline_id``; two pipelines on one server need disjoint
``server_id_range``) and ``spark_default`` (e.g. ``{"conn_type": "spark", "host": "local[*]"}``).
Defaults for the roots and tables come from ``MYSQLCDC_SINK_ROOT``, ``MYSQLCDC_STATE_ROOT`` and
``MYSQLCDC_TABLES`` (comma-separated) when set. A lake on S3 (or GCS, ADLS) takes its credentials
from the connection named by the ``storage_conn_id`` param (default ``MYSQLCDC_STORAGE_CONN_ID``),
e.g. ``aws_default``; README "Deploy to production".
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import DAG, Param

from airflow_provider_mysqlcdc.core.chunk import DEFAULT_CHUNK_SIZE
from airflow_provider_mysqlcdc.core.config import DEFAULT_CHUNKS_PER_TASK, STARTUP_MODES, STREAM_MODES
from airflow_provider_mysqlcdc.core.schema_policy import DEFAULT_SCHEMA_CHANGE_POLICY, SCHEMA_CHANGE_POLICIES
from airflow_provider_mysqlcdc.operators import (
    MySqlCdcPlanOperator,
    MySqlCdcSnapshotOperator,
    MySqlCdcStopStreamOperator,
    MySqlCdcStreamOperator,
    MySqlCdcVerifyOperator,
)
from airflow_provider_mysqlcdc.sensors.stream import MySqlCdcStreamSensor

TABLE_PATTERN = r"^[^.\s`]+\.[^.\s`]+$"
# A name or a pattern (shop.*, shop\.order_[0-9]+): the plan task parses it exactly and names the fix.
SELECTION_PATTERN = r"^[^\s]*\.[^\s]*$"
PIPELINE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
# An environment variable set but empty counts as unset: a required field of the trigger form must not
# default to an empty value (the form would refuse to trigger).
DEFAULT_SINK_ROOT = os.environ.get("MYSQLCDC_SINK_ROOT") or "/tmp/mysqlcdc/lake"
DEFAULT_STATE_ROOT = os.environ.get("MYSQLCDC_STATE_ROOT") or "/tmp/mysqlcdc/state"
DEFAULT_STORAGE_CONN_ID = os.environ.get("MYSQLCDC_STORAGE_CONN_ID") or None
# Snapshot groups running at once, and the stream's binlog decoders: each takes its own replication
# server_id from the connection's server_id_range, which the plan task checks holds both (README
# "Connections"). Mapped-task concurrency is not templated, so it is a constant here.
MAX_PARALLEL_GROUPS = 16
STREAM_READERS = 8
DEFAULT_TABLES = [t.strip() for t in os.environ.get("MYSQLCDC_TABLES", "").split(",") if t.strip()] or ["shop.orders"]

P = "params"  # shorthand for templates below

with DAG(
    dag_id="mysql_cdc",
    description="Lock-free MySQL CDC: chunked snapshot on Spark, then the binlog stream, into Delta Lake",
    schedule=None,
    catchup=False,
    max_active_runs=1,  # runs reconcile one pipeline state; two at once would race
    render_template_as_native_obj=True,  # lists and numbers reach the operators as such
    tags=["mysql", "cdc", "spark", "delta"],
    doc_md=__doc__,
    params={
        "pipeline_id": Param(
            "shop", type="string", pattern=PIPELINE_PATTERN, title="Pipeline id",
            description="Names the pipeline's state and stream. One pipeline = one stream.",
        ),
        "source_conn_id": Param(
            "mysql_cdc_default", type="string", minLength=1, title="Source connection",
            description="The Airflow connection (type MySQL CDC) of the server to capture from: one DAG serves several "
            "sources, one pipeline_id each. Two pipelines on one server need disjoint server_id_range (a connection "
            "each).",
        ),
        "tables": Param(
            DEFAULT_TABLES, type="array", items={"type": "string", "pattern": SELECTION_PATTERN}, minItems=1,
            title="Tables", description="<database>.<table> names or patterns to capture: shop.* (glob), "
            "shop\\.order_[0-9]+ (regex on the whole name). Add one to start capturing it; a new table matching a "
            "pattern is picked up by the next run. Views, and tables a pattern matched that cannot be captured "
            "(no primary key...), are skipped and listed in the plan task's log.",
        ),
        "exclude_tables": Param(
            None, type=["null", "array"], items={"type": "string", "pattern": SELECTION_PATTERN},
            title="Exclude tables",
            description="Names or patterns left out of what Tables selects (e.g. shop.tmp_*). A table already "
            "captured stays captured.",
        ),
        "sink_root": Param(
            DEFAULT_SINK_ROOT, type="string", minLength=1, title="Sink root",
            description="Delta tables go to <sink_root>/<db>/<table> (local path or s3://, abfss://, gs://).",
        ),
        "state_root": Param(
            DEFAULT_STATE_ROOT, type="string", minLength=1, title="State root",
            description="Plans, chunk results, the stream manifest and checkpoint (shared by all workers).",
        ),
        "storage_conn_id": Param(
            DEFAULT_STORAGE_CONN_ID, type=["null", "string"], title="Storage connection",
            description="Airflow connection with the object-store credentials of the sink and state roots (e.g. "
            "aws_default); empty for a local lake or the machine's own credentials.",
        ),
        # No JSON-schema minimum: the form would silently clamp a typo (0 -> 1); the plan task
        # refuses a chunk size below 100 rows with the numbers instead (allow_large_plan overrides).
        "chunk_size": Param(
            DEFAULT_CHUNK_SIZE, type="integer", title="Chunk size",
            description="Rows per snapshot chunk (at least 100 unless allow_large_plan).",
        ),
        "chunks_per_task": Param(
            DEFAULT_CHUNKS_PER_TASK, type="integer", minimum=1, title="Chunks per task",
            description="Chunks per mapped snapshot task (one Spark application each).",
        ),
        "startup_mode": Param(
            "initial", enum=list(STARTUP_MODES), title="Startup mode",
            description="initial = snapshot + stream; snapshot-only; latest-offset / specific-offset / "
            "earliest-offset (the oldest binlog the source keeps) / timestamp (the first transaction at or after "
            "Startup timestamp) = new tables start there with no snapshot.",
        ),
        "startup_timestamp": Param(
            None, type=["null", "string"], title="Startup timestamp",
            description="For startup_mode timestamp: ISO 8601, e.g. 2026-11-24T10:00:00Z (no zone = UTC).",
        ),
        "specific_offset_gtid_set": Param(
            None, type=["null", "string"], title="Specific offset: GTID set",
            description="For startup_mode specific-offset: new tables start after these transactions, e.g. "
            "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100 (MySQL) or 0-1-100 (MariaDB). Unlike a file and position it "
            "names the same point on every server of the replication topology. Takes precedence over file/pos.",
        ),
        "specific_offset_file": Param(
            None, type=["null", "string"], title="Specific offset: binlog file",
            description="For startup_mode specific-offset, e.g. mysql-bin.000042",
        ),
        "specific_offset_pos": Param(
            None, type=["null", "integer"], minimum=4, title="Specific offset: position",
            description="For startup_mode specific-offset, e.g. 4",
        ),
        "resnapshot_tables": Param(
            None, type=["null", "array"], items={"type": "string", "pattern": TABLE_PATTERN},
            title="Re-snapshot tables",
            description="Captured tables to read again from the source while the stream runs on; each Delta "
            "table is swapped in whole with one commit.",
        ),
        "chunk_key_columns": Param(
            None, type=["null", "object"], title="Chunk key columns",
            description='Per table, the columns to split it on instead of its primary key; needed for a table without '
            'one, where they must be NOT NULL and covered by a UNIQUE index (rows are merged by them in the lake). '
            'E.g. {"shop.events": ["event_id"]}.',
            propertyNames={"pattern": TABLE_PATTERN},
            additionalProperties={"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        ),
        "repair_chunks": Param(
            None, type=["null", "object"], title="Repair chunks",
            description="What a failed verify reports, e.g. {\"shop.orders\": [3, 7]}: only those chunks are "
            "snapshotted again and swapped in (one Delta commit per table) while the stream runs.",
        ),
        "recover_purged": Param(
            False, type="boolean", title="Recover from a purged binlog",
            description="The stream's restart position was purged from the source (the plan task says so): "
            "re-snapshot every captured table and restart the stream from those snapshots, while the source is "
            "written. Nothing is skipped silently.",
        ),
        "snapshot_filters": Param(
            None, type=["null", "object"], title="Partial backfill filters",
            description="Per captured table, a SQL condition, e.g. {\"shop.orders\": \"created_at >= '2026-11-01'\"}: "
            "only the rows it selects are read again and swapped in while the stream runs; the table's other rows "
            "stay as they are.",
            propertyNames={"pattern": TABLE_PATTERN},
            additionalProperties={"type": "string", "minLength": 1},
        ),
        "max_rows_per_second": Param(
            None, type=["null", "integer"], minimum=0, title="Snapshot rate limit",
            description="The most rows per second the snapshot reads from the source, over all its tasks, to "
            "protect a busy server (empty or 0 = unlimited).",
        ),
        "changelog_tables": Param(
            None, type=["null", "array"], items={"type": "string", "pattern": SELECTION_PATTERN},
            title="Changelog tables",
            description="Names or patterns of captured tables that also get a changelog: an append-only Delta table "
            "at <sink_root>/_changelog/<db>/<table> with every change (op, before and after images, commit time, "
            "binlog position, transaction) and the snapshot rows as op r; the SCD type 2 history is derived from "
            "it. A table switched on after its snapshot is logged from then on (re-snapshot it to seed it).",
        ),
        "metadata_columns": Param(
            False, type="boolean", title="Metadata columns",
            description="New tables' Delta tables get _op (r snapshot, c insert, u update), _commit_ts, _binlog_file "
            "and _binlog_pos: the event that last wrote each row. Fixed per table when it is first captured.",
        ),
        "routes": Param(
            None, type=["null", "array"], title="Routes (sharded tables)",
            description="Route shards into one Delta table: each rule's source is a name or pattern of selected "
            "tables (e.g. db_[0-9]+\\.orders_[0-9]+), its target a <database>.<table>. The target gets "
            "_source_database and _source_table columns, which join the primary key, so one key in two shards is two "
            "rows. Shards must have the same columns, types and key (the plan names what differs).",
            items={"type": "object", "required": ["source", "target"], "additionalProperties": False,
                   "properties": {"source": {"type": "string", "pattern": SELECTION_PATTERN},
                                  "target": {"type": "string", "pattern": TABLE_PATTERN}}},
        ),
        "takeover_tables": Param(
            None, type=["null", "array"], items={"type": "string", "pattern": TABLE_PATTERN}, title="Take over tables",
            description="Tables whose Delta table another pipeline owns: re-snapshot them under this pipeline "
            "(the other pipeline's stream then refuses to write them).", section="Advanced",
        ),
        "allow_large_plan": Param(
            False, type="boolean", title="Allow a large plan", section="Advanced",
            description="Allow a chunk size below 100 rows or more than 10,000 chunks per table.",
        ),
        "backfill_tables": Param(
            None, type=["null", "array"], items={"type": "string", "pattern": TABLE_PATTERN}, section="Deprecated",
            title="Backfill tables (deprecated: use Re-snapshot tables)",
            description="The old name of resnapshot_tables; still accepted, with a warning in the plan task's log.",
        ),
        "verify": Param(
            False, type="boolean", title="Verify",
            description="After the stream caught up, compare every captured table with its source chunk by chunk "
            "(row count and a digest of every value, one scan per side; the stream keeps running). The task fails "
            "naming each differing chunk.",
        ),
        "skip_backfill": Param(
            False, type="boolean", title="Skip backfill",
            description="Skip the binlog window replay of each chunk (faster; at-least-once until the stream "
            "catches up).",
        ),
        "stream_mode": Param(
            "detached", enum=list(STREAM_MODES), title="Stream mode",
            description="detached: the run ends while the stream keeps running; attached: the stream task is the "
            "stream.",
        ),
        "schema_change_policy": Param(
            DEFAULT_SCHEMA_CHANGE_POLICY, enum=list(SCHEMA_CHANGE_POLICIES), title="Schema-change policy",
            description="What a DDL of a captured table does to the lake. lenient: columns are added and widened, "
            "dropped or renamed columns are kept (NULL from then on), TRUNCATE is ignored, a dropped table keeps its "
            "Delta table; evolve: the lake follows the source (columns dropped and renamed, TRUNCATE and DROP empty "
            "the Delta table); fail: the stream stops before any DDL that changes a table, naming the fix. Takes "
            "effect when the stream (re)starts.",
        ),
        "spark_conf": Param(
            None, type=["null", "object"], title="Spark conf",
            description="Extra Spark configuration for every job, e.g. {\"spark.executor.memory\": \"2g\"}.",
        ),
        # The lake's disk (README "Table maintenance"); the stream operator refuses bad values, naming
        # the fix. They take effect when the stream (re)starts.
        "rewrite_below_mb": Param(
            2, type="integer", title="Small-table size (MiB)", section="Disk",
            description="Tables (a routed shard: its part) up to this size are applied from rows the stream keeps "
            "in memory: rewritten whole at most once per small-table retention, changed rows marked with deletion "
            "vectors in between. 0 = never.",
        ),
        "small_table_retention_seconds": Param(
            120, type="number", title="Small-table retention (s)", section="Disk",
            description="How long a reader of an older version of a small table has to read it: the files its "
            "batches replace, and its log entries, are deleted this long after. At most the vacuum retention.",
        ),
        "vacuum_retention_hours": Param(
            1.0, type="number", title="Vacuum retention (hours)", section="Disk",
            description="Other tables: data files no version of this long refers to are deleted (keep it above "
            "your longest read).",
        ),
    },
) as dag:
    plan = MySqlCdcPlanOperator(
        task_id="plan",
        pipeline_id="{{ params.pipeline_id }}",
        mysql_cdc_conn_id="{{ params.source_conn_id }}",
        sink_root="{{ params.sink_root }}",
        state_root="{{ params.state_root }}",
        tables="{{ params.tables }}",
        exclude_tables="{{ params.exclude_tables }}",
        chunk_size="{{ params.chunk_size }}",
        chunks_per_task="{{ params.chunks_per_task }}",
        startup_mode="{{ params.startup_mode }}",
        specific_offset={"file": "{{ params.specific_offset_file }}", "pos": "{{ params.specific_offset_pos }}",
                         "gtid_set": "{{ params.specific_offset_gtid_set }}"},
        startup_timestamp="{{ params.startup_timestamp }}",
        resnapshot_tables="{{ params.resnapshot_tables }}",
        repair_chunks="{{ params.repair_chunks }}",
        recover_purged="{{ params.recover_purged }}",
        snapshot_filters="{{ params.snapshot_filters }}",
        max_rows_per_second="{{ params.max_rows_per_second }}",
        changelog_tables="{{ params.changelog_tables }}",
        metadata_columns="{{ params.metadata_columns }}",
        routes="{{ params.routes }}",
        backfill_tables="{{ params.backfill_tables }}",
        skip_backfill="{{ params.skip_backfill }}",
        chunk_key_columns="{{ params.chunk_key_columns }}",
        takeover_tables="{{ params.takeover_tables }}",
        allow_large_plan="{{ params.allow_large_plan }}",
        storage_conn_id="{{ params.storage_conn_id }}",
        stream_readers=STREAM_READERS,
        max_parallel_groups=MAX_PARALLEL_GROUPS,
    )
    # The plan's group descriptors carry the pipeline id, roots and connections; the plan in the state
    # store carries the rest of the pipeline's config (skip_backfill, startup_mode...).
    snapshot = MySqlCdcSnapshotOperator.partial(
        task_id="snapshot",
        conf="{{ params.spark_conf }}",
        map_index_template="{{ task.group_label }}",
        max_active_tis_per_dagrun=MAX_PARALLEL_GROUPS,
        retries=1,
        retry_delay=timedelta(seconds=10),
    ).expand_kwargs(plan.output)
    stream = MySqlCdcStreamOperator(
        task_id="stream",
        pipeline_id="{{ params.pipeline_id }}",
        mysql_cdc_conn_id="{{ params.source_conn_id }}",
        state_root="{{ params.state_root }}",
        plan_id=plan.output["plan_id"],  # the plan has the sink root and startup mode
        snapshot_summaries=snapshot.output,
        stream_mode="{{ params.stream_mode }}",
        schema_change_policy="{{ params.schema_change_policy }}",
        rewrite_below_mb="{{ params.rewrite_below_mb }}",
        small_table_retention_seconds="{{ params.small_table_retention_seconds }}",
        vacuum_retention_hours="{{ params.vacuum_retention_hours }}",
        readers=STREAM_READERS,
        conf="{{ params.spark_conf }}",
        storage_conn_id="{{ params.storage_conn_id }}",
    )
    wait_caught_up = MySqlCdcStreamSensor(
        task_id="wait_caught_up",
        pipeline_id="{{ params.pipeline_id }}",
        mysql_cdc_conn_id="{{ params.source_conn_id }}",
        state_root="{{ params.state_root }}",
        stream_handle=stream.output,
        condition="caught_up",
        storage_conn_id="{{ params.storage_conn_id }}",
        timeout=3600,
        poke_interval=2,
        # A stream that is not running fails the sensor at once (no retry); the retries are for an
        # Airflow 3 scheduler race that can fail a deferred task whose trigger fires quickly (a
        # stale executor event from the defer-exit: apache/airflow issues 66374 and 72716).
        retries=2,
        retry_delay=timedelta(seconds=5),
    )
    verify = MySqlCdcVerifyOperator(
        task_id="verify",
        pipeline_id="{{ params.pipeline_id }}",
        mysql_cdc_conn_id="{{ params.source_conn_id }}",
        state_root="{{ params.state_root }}",
        sink_root="{{ params.sink_root }}",
        enabled="{{ params.verify }}",
        storage_conn_id="{{ params.storage_conn_id }}",
    )
    plan >> snapshot >> stream >> wait_caught_up >> verify

with DAG(
    dag_id="mysql_cdc_stop",
    description="Stop a mysql_cdc pipeline's stream gracefully (after its running micro-batch)",
    schedule=None,
    catchup=False,
    render_template_as_native_obj=True,  # an empty storage_conn_id reaches the operator as None, not "None"
    tags=["mysql", "cdc"],
    params={
        "pipeline_id": Param("shop", type="string", pattern=PIPELINE_PATTERN, title="Pipeline id"),
        "state_root": Param(DEFAULT_STATE_ROOT, type="string", minLength=1, title="State root"),
        "storage_conn_id": Param(DEFAULT_STORAGE_CONN_ID, type=["null", "string"], title="Storage connection"),
    },
) as stop_dag:
    MySqlCdcStopStreamOperator(
        task_id="stop_stream", pipeline_id="{{ params.pipeline_id }}", state_root="{{ params.state_root }}",
        storage_conn_id="{{ params.storage_conn_id }}",
    )
