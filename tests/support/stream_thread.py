"""The stream run in a thread of the test process, as the stream job runs it (``run_stream`` with a
run recorder): schema changes are followed, and hand-overs pause and resume it through the state
store like a detached stream's."""

from __future__ import annotations

import threading
import time
from typing import Any

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import StreamRunRecorder, stream_state
from airflow_provider_mysqlcdc.stream.job import StreamOptions, run_stream


def snapshot_tables(spark: Any, settings: Any, store: StateStore, sink: DeltaSink, tables: list[str],
                    chunk_size: int, chunks_per_group: int, plan_id: str = "p1") -> Any:  # fmt: skip
    """Plan, snapshot every group and write the stream manifest (what a first DAG run does)."""
    with settings.connect() as conn:
        plan = plan_snapshot(conn, tables, chunk_size, chunks_per_group)
    store.write_plan(plan_id, plan.to_dict())
    for g in plan.groups:
        run_snapshot_group(spark, settings, store, plan_id, g.group_id, sink)
    store.write_manifest(build_manifest(plan, store.read_all_results(plan_id)))
    return plan


class StreamThread(threading.Thread):
    def __init__(self, spark: Any, settings: Any, store: StateStore, sink: DeltaSink, run_id: str = "stream-test",
                 options: StreamOptions | None = None):  # fmt: skip
        super().__init__(daemon=True)
        self.args = (spark, settings, store, sink)
        self.options = options or StreamOptions(trigger_seconds=0.5)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.recorder = StreamRunRecorder(store, run_id)
        self.recorder.write(state="starting")

    def start_running(self, timeout: float = 120.0) -> StreamThread:
        """Start, and return once the stream reports running (or died: ``error`` says why)."""
        self.start()
        store = self.args[2]
        deadline = time.monotonic() + timeout
        while not stream_state(store)["running"] and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self

    def wait_applied(self, settings: Any, timeout: float = 300) -> None:
        """Return once the stream applied everything up to the source's offset now; a stream thread
        that died says why instead of a timeout."""
        from airflow_provider_mysqlcdc.mysql.server import current_offset
        from airflow_provider_mysqlcdc.stream.control import wait_until_applied

        store = self.args[2]
        with settings.connect() as conn:
            target = current_offset(conn)
        end = time.monotonic() + timeout
        while True:
            assert self.is_alive() or self.error is None, self.error
            if stream_state(store)["state"] != "starting":
                self.recorder._last_beat = 0  # heartbeat now, not in 5 s
                try:
                    wait_until_applied(store, target, timeout=5)
                    return
                except TimeoutError:
                    pass
            assert time.monotonic() < end, f"the stream did not reach {target}"
            time.sleep(0.2)

    def run(self) -> None:
        spark, settings, store, sink = self.args
        try:
            run_stream(spark, settings, store, sink, self.options, self.recorder, self.stop_event)
        except BaseException as exc:  # the test reads it
            self.error = exc


def streaming_pipeline(spark: Any, settings: Any, root: Any, pipeline_id: str, tables: list[str], chunk_size: int,
                       run_id: str) -> tuple[StateStore, DeltaSink, StreamThread]:  # fmt: skip
    """A pipeline under ``root`` (state/ and lake/) whose tables are snapshotted and whose stream runs."""
    store = StateStore(f"{root}/state", pipeline_id)
    sink = DeltaSink(f"{root}/lake", owner=pipeline_id)
    snapshot_tables(spark, settings, store, sink, tables, chunk_size, 64, plan_id="p0")
    return store, sink, StreamThread(spark, settings, store, sink, run_id=run_id).start_running()
