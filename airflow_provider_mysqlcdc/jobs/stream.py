"""spark-submit entry point: the long-lived binlog stream of a pipeline into the Delta sink.

    spark-submit --jars /usr/share/java/mariadb-java-client.jar \
        airflow_provider_mysqlcdc/jobs/stream.py \
        --state-root /data/state --pipeline-id shop --sink-root /data/lake

Reads the stream manifest from the state store (built by the stream operator from the snapshot's
high watermarks) and resumes from the checkpoint there when it exists. It records its run in the
state store (``stream/run.json``: state, heartbeat, committed offset) and stops once the running
micro-batch has finished on SIGTERM or on a stop request (``mysqlcdc stop``, the stop operator).
The source connection arrives as JSON in ``$MYSQLCDC_SOURCE`` and the object-store credentials of
the sink and state store in ``$MYSQLCDC_STORAGE`` (never on the command line); the binlog source
reads both from the environment itself, so neither is a source option in the query plan.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from typing import Any

from airflow_provider_mysqlcdc.core.schema_policy import DEFAULT_SCHEMA_CHANGE_POLICY, SCHEMA_CHANGE_POLICIES
from airflow_provider_mysqlcdc.stream.driver_log import driver_log
from airflow_provider_mysqlcdc.stream.launcher import DRIVER_LOG_ENV
from airflow_provider_mysqlcdc.stream.options import DEFAULT_SMALL_TABLE_RETENTION_SECONDS, StreamOptions

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-root", required=True)
    p.add_argument("--pipeline-id", required=True)
    p.add_argument("--sink-root", required=True)
    p.add_argument("--source-env", default="MYSQLCDC_SOURCE")
    p.add_argument("--run-id", default=None, help="id recorded in the run record (default: random)")
    p.add_argument("--trigger-seconds", type=float, default=1.0)
    p.add_argument("--max-events-per-trigger", type=int, default=200_000)
    p.add_argument("--max-bytes-per-trigger", type=int, default=32 * 1024 * 1024)
    p.add_argument("--readers", type=int, default=None)
    p.add_argument("--max-inline-bytes", type=int, default=None,
                   help="change-block bytes per micro-batch sent to the driver; the rest is staged (default 32 MiB)")
    p.add_argument("--apply-memory-mb", type=int, default=512,
                   help="memory the driver may use to fold one table's batch; larger batches spill (default 512)")
    p.add_argument("--apply-threads", type=int, default=4,
                   help="tables of one micro-batch applied at once (default 4; 1 = one after the other)")
    p.add_argument("--apply-processes", type=int, default=None,
                   help="processes applying a micro-batch's tables, each owning a share of them (default: one "
                   "per core, at most 4, for 64 tables or more; 0 = the driver's threads only)")
    p.add_argument("--rewrite-below-mb", type=int, default=StreamOptions().rewrite_below_mb,
                   help="Delta tables up to this size take a batch by a whole-table rewrite; larger ones by "
                   f"deletion vectors or a MERGE (default {StreamOptions().rewrite_below_mb}; 0 = never rewrite)")
    p.add_argument("--small-table-retention-seconds", type=float, default=None,
                   help="a small table's superseded files and log entries are deleted this long after (a reader of "
                   "an older version has this long to read it), and it is rewritten whole at most once per this "
                   f"time (default {DEFAULT_SMALL_TABLE_RETENTION_SECONDS:g}, or the vacuum retention if shorter)")
    p.add_argument("--no-deletion-vectors", dest="deletion_vectors", action="store_false",
                   help="bigger tables take a batch by a MERGE (copy-on-write) instead of deletion vectors; for "
                   "readers without deletion-vector support")
    p.add_argument("--schema-change-policy", choices=SCHEMA_CHANGE_POLICIES, default=DEFAULT_SCHEMA_CHANGE_POLICY,
                   help="what a DDL of a captured table does: evolve (the lake follows), lenient (the lake keeps "
                   "what it has: dropped columns kept, TRUNCATE ignored), fail (stop before it)")
    p.add_argument("--scratch-dir", default=None, help="local scratch space of the driver (default: system temp)")
    p.add_argument("--maintenance-interval", type=float, default=600.0,
                   help="seconds between table maintenance rounds (compaction, checkpoint, vacuum); 0 = never")
    p.add_argument("--vacuum-retention-hours", type=float, default=1.0,
                   help="data files unreferenced for longer are deleted (keep above your longest read)")
    p.add_argument("--log-retention-hours", type=float, default=24.0, help="Delta log entries kept this long")
    args = p.parse_args(argv)
    with driver_log(os.environ.get(DRIVER_LOG_ENV)):  # before any thread: it forks (stream/driver_log.py)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    # this package at INFO; the libraries' INFO is noise in a driver log (py4j: a line per callback, and
    # a traceback at INFO for every call the JVM did not answer once it is gone)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)  # fmt: skip
    logging.getLogger("airflow_provider_mysqlcdc").setLevel(logging.INFO)

    from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy
    from airflow_provider_mysqlcdc.spark_session import build_spark_session
    from airflow_provider_mysqlcdc.state import StateStore
    from airflow_provider_mysqlcdc.storage import STORAGE_ENV, LakeStorage
    from airflow_provider_mysqlcdc.stream.control import StreamRunRecorder
    from airflow_provider_mysqlcdc.stream.failure import explain_stream_failure
    from airflow_provider_mysqlcdc.stream.job import run_stream

    storage = LakeStorage.from_env()
    store = StateStore(args.state_root, args.pipeline_id, storage)
    recorder = StreamRunRecorder(store, args.run_id or uuid.uuid4().hex[:12])
    recorder.write(state="starting")
    raw = os.environ.get(args.source_env)
    if not raw:
        msg = f"environment variable {args.source_env} with the source connection JSON is not set"
        recorder.write(state="failed", error=msg)
        log.error("the stream failed: %s", msg)
        return 1
    settings = ConnectionSettings.from_dict(json.loads(raw))
    spark = None
    driver_memory = None
    try:
        _follow_failover(settings, store)
        spark = build_spark_session(f"mysqlcdc-stream-{args.pipeline_id}", master=None)
        driver_memory = spark.sparkContext.getConf().get("spark.driver.memory", "1g")
        run_stream(
            spark,
            settings,
            store,
            DeltaSink(args.sink_root, storage, owner=args.pipeline_id),
            StreamOptions(
                trigger_seconds=args.trigger_seconds,
                max_events_per_trigger=args.max_events_per_trigger,
                max_bytes_per_trigger=args.max_bytes_per_trigger,
                readers=args.readers,
                max_inline_bytes=args.max_inline_bytes,
                apply_memory_mb=args.apply_memory_mb,
                apply_threads=args.apply_threads,
                apply_processes=args.apply_processes,
                rewrite_below_mb=args.rewrite_below_mb,
                small_table_retention_seconds=args.small_table_retention_seconds,
                deletion_vectors=args.deletion_vectors,
                schema_change_policy=args.schema_change_policy,
                scratch_dir=args.scratch_dir,
                source_env=args.source_env,
                storage_env=STORAGE_ENV if storage.options else None,
                maintenance=MaintenancePolicy(
                    interval_seconds=args.maintenance_interval,
                    retention_hours=args.vacuum_retention_hours,
                    log_retention_hours=max(args.log_retention_hours, args.vacuum_retention_hours),
                ),
            ),
            recorder=recorder,
        )
    except Exception as exc:  # the message of a failed stream is what the operator shows
        msg = explain_stream_failure(exc, store, driver_memory, lambda: _jvm_answers(spark))
        if recorder.record.state != "failed" or msg != str(exc):
            recorder.write(state="failed", error=msg)
        log.error("%s", _one_line(msg if msg.startswith("the stream failed") else f"the stream failed: {msg}"))
        return 1
    finally:
        if spark is not None:
            try:
                spark.stop()
            except Exception:  # the JVM is already gone (the failure above says why)
                pass
    print("MYSQLCDC_RESULT " + json.dumps({"stopped": True, "run_id": recorder.run_id}), flush=True)
    return 0


def _follow_failover(settings: Any, store: Any) -> None:
    """A stream restarted after a failover resumes on the new server by GTID set (``failover.py``)."""
    from airflow_provider_mysqlcdc.failover import follow_failover

    conn = settings.connect()
    try:
        follow_failover(conn, store, stop_stream=False)
    finally:
        conn.close()


def _one_line(msg: str, limit: int = 2000) -> str:
    """A failure's message as one log line: its first line (a Java error's stack trace stays in the
    run record, which ``mysqlcdc status`` shows)."""
    first = msg.strip().splitlines()[0] if msg.strip() else msg
    return first[:limit] + (" ..." if len(first) > limit or first != msg.strip() else "")


#: How long a driver JVM that sent a Java error must go on answering to count as alive: one exiting
#: on an error (Spark's uncaught-exception handler after an executor thread's OutOfMemoryException)
#: runs its shutdown hooks first and answers meanwhile. (If the exit takes this process with it,
#: ``stream_state`` explains the failure from the driver log instead.)
JVM_EXIT_GRACE_SECONDS = 3.0


def _jvm_answers(spark: Any, grace: float = JVM_EXIT_GRACE_SECONDS) -> bool:
    """Whether the driver JVM still answers a trivial call throughout ``grace`` seconds (see
    ``explain_stream_failure``); False as soon as it does not."""
    if spark is None:
        return False
    from airflow_provider_mysqlcdc.stream.job import jvm_answers

    deadline = time.monotonic() + grace
    while True:
        time.sleep(0.5)
        if not jvm_answers(spark):
            return False
        if time.monotonic() >= deadline:
            return True


if __name__ == "__main__":
    sys.exit(main())
