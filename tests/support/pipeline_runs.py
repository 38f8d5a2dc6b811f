"""A snapshot and a stream run to catch-up, as the end-to-end tests drive them in-process."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.stream.job import StreamOptions, start_stream, stop_gracefully, wait_until_caught_up


def snapshot_tables(spark: Any, settings: Any, store: Any, sink: Any, tables: list[str], chunk_size: int,
                    chunks_per_group: int, plan_id: str = "p1") -> Any:  # fmt: skip
    """Plan ``tables``, run every group, write the manifest; the plan."""
    with settings.connect() as conn:
        plan = plan_snapshot(conn, tables, chunk_size, chunks_per_group)
    store.write_plan(plan_id, plan.to_dict())
    for g in plan.groups:
        run_snapshot_group(spark, settings, store, plan_id, g.group_id, sink)
    store.write_manifest(build_manifest(plan, store.read_all_results(plan_id)))
    return plan


def stream_to_catch_up(
    spark: Any, settings: Any, store: Any, sink: Any, options: StreamOptions, writers: Sequence[Any], seconds: float,
    settled: Callable[[], None] | None = None,
) -> None:
    """Stream while ``writers`` write for ``seconds``; stop them, wait for ``settled`` (e.g. a replica
    catching up), then until the stream has applied the server's head; stop the stream."""
    query = start_stream(spark, settings, store, sink, options)
    try:
        time.sleep(seconds)
        for w in writers:
            w.stop_event.set()
            w.join()
        if settled is not None:
            settled()
        with settings.connect() as conn:
            target = current_offset(conn)
        wait_until_caught_up(query, target)
    finally:
        stop_gracefully(query)
