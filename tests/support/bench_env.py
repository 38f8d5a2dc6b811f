"""What every benchmark sets up and tears down: a private MariaDB, Spark ``local[2]``, a scratch
directory — and how it reports: one JSON line on stdout with the machine's load beside the figures."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_provider_mysqlcdc.spark_session import build_spark_session
from tests.support.mariadb import MariaDBServer


@contextmanager
def bench_environment(app_name: str) -> Iterator[tuple[MariaDBServer, Any, str]]:
    """``(server, spark, work directory)``, all removed afterwards whatever happened."""
    work = tempfile.mkdtemp(prefix=f"{app_name}-")
    server = MariaDBServer()
    server.start()
    spark = None
    try:
        spark = build_spark_session(app_name, master="local[2]")
        yield server, spark, work
    finally:
        if spark is not None:
            spark.stop()
        server.destroy()
        shutil.rmtree(work, ignore_errors=True)


def print_result(out: dict[str, Any]) -> None:
    """The benchmark's one JSON line, with the 1-minute load average (was the machine quiet?)."""
    print(json.dumps({**out, "load_average_1m": round(os.getloadavg()[0], 2)}))


def snapshot_pipeline(spark: Any, settings: Any, config: Any, reader: str = "auto") -> tuple[Any, Any]:
    """A first DAG run of ``config`` in this process: plan ``p1``, every snapshot group, finalize.
    Returns ``(store, sink)``."""
    from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.snapshot.group import SnapshotOptions, run_snapshot_group
    from airflow_provider_mysqlcdc.state import StateStore

    store = StateStore(config.state_root, config.pipeline_id)
    sink = DeltaSink(config.sink_root, owner=config.pipeline_id)
    with settings.connect() as conn:
        outcome = plan_run(conn, store, config, "p1", sink.exists, table_owner=sink.owner_of)
    for g in outcome.groups:
        run_snapshot_group(spark, settings, store, "p1", g["group_id"], sink, SnapshotOptions(reader=reader))
    finalize_run(store, sink, "p1")
    return store, sink
