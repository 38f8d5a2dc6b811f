"""spark-submit entry point: snapshot one chunk group (watermark-bracketed) into the Delta sink.

    spark-submit --jars /usr/share/java/mariadb-java-client.jar \
        airflow_provider_mysqlcdc/jobs/snapshot.py --state-root /data/state --pipeline-id shop \
        --plan-id 20261122T0300 --group-id 3 --sink-root /data/lake

The source connection arrives as JSON in the environment variable named by ``--source-env``
(default ``MYSQLCDC_SOURCE``), and the object-store credentials of the sink and state store in
``MYSQLCDC_STORAGE`` (delta-rs storage options; unset for a local lake), never on the command
line (it would show in ``ps`` and on the Spark UI). The job writes
its chunk results to the state store and prints ``MYSQLCDC_RESULT <json summary>``; the exit code
is 0 on success, 1 on a clear failure (an ``error: ...`` line says what to fix), other codes for
crashes. (spark-submit merges the Python driver's stderr into its stdout.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-root", required=True)
    p.add_argument("--pipeline-id", required=True)
    p.add_argument("--plan-id", required=True)
    p.add_argument("--group-id", required=True, type=int)
    p.add_argument("--sink-root", required=True)
    p.add_argument("--source-env", default="MYSQLCDC_SOURCE")
    p.add_argument("--skip-backfill", action="store_true")
    p.add_argument("--fetch-size", type=int, default=10_000)
    p.add_argument("--jdbc-jar", default=None)
    p.add_argument(
        "--reader", choices=("auto", "native", "jdbc"), default="auto",
        help="chunk reader: native Arrow reader where it reads the table exactly (auto), always, or Spark JDBC",
    )
    p.add_argument("--window-memory-mb", type=int, default=512,
                   help="memory for folding the group's binlog window; a larger window spills (default 512)")
    p.add_argument("--scratch-dir", default=None, help="local scratch space (default: the system temp dir)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.snapshot.group import SnapshotError, SnapshotOptions, run_snapshot_group
    from airflow_provider_mysqlcdc.spark_session import build_spark_session
    from airflow_provider_mysqlcdc.state import StateStore
    from airflow_provider_mysqlcdc.storage import LakeStorage

    raw = os.environ.get(args.source_env)
    if not raw:
        print(
            f"error: environment variable {args.source_env} with the source connection JSON is not set", file=sys.stderr
        )
        return 1
    settings = ConnectionSettings.from_dict(json.loads(raw))
    storage = LakeStorage.from_env()
    spark = build_spark_session(
        f"mysqlcdc-snapshot-{args.pipeline_id}-g{args.group_id}", master=None, jdbc_jar=args.jdbc_jar
    )
    try:
        result = run_snapshot_group(
            spark,
            settings,
            StateStore(args.state_root, args.pipeline_id, storage),
            args.plan_id,
            args.group_id,
            DeltaSink(args.sink_root, storage, owner=args.pipeline_id),
            SnapshotOptions(skip_backfill=args.skip_backfill, fetch_size=args.fetch_size, reader=args.reader,
                            window_memory_mb=args.window_memory_mb, scratch_dir=args.scratch_dir),
        )
    except SnapshotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        _record_error(args, str(exc))
        return 1
    except Exception as exc:
        _record_error(args, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        spark.stop()
    # spark-submit merges the Python driver's stderr into its stdout: mark the result line.
    print("MYSQLCDC_RESULT " + json.dumps(result.summary()), flush=True)
    return 0


def _record_error(args: argparse.Namespace, message: str) -> None:
    """Leave the failure's message where the operator looks for it (the driver may be remote)."""
    from airflow_provider_mysqlcdc.state import StateStore
    from airflow_provider_mysqlcdc.storage import LakeStorage

    try:
        store = StateStore(args.state_root, args.pipeline_id, LakeStorage.from_env())
        store.write_group_error(args.plan_id, args.group_id, message)
    except Exception as exc:  # the job's own exit code still reports the failure
        print(f"warning: could not record the error in the state store: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
