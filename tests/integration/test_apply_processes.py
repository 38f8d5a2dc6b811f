"""The stream's tables applied by processes that each own a share of them (stream/apply_processes.py).

A stream with ``apply_processes=2`` runs while a writer changes three tables (BIGINT key with key
moves, composite key, case-insensitive VARCHAR key). One apply process is killed (SIGKILL) in the
middle: the next batch starts a new one and sends its tables again, those it had committed skip
their batch id. Afterwards every table equals its source, row for row. The whole-database test
(test_whole_database.py, 200 tables) runs with the automatic setting, which uses processes too.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.apply_processes import share_of
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.stream_thread import StreamThread, snapshot_tables
from tests.support.verify import assert_sink_equals_source

ROWS = 3000


def _apply_processes() -> list[int]:
    """Pids of this test process's children started by multiprocessing's spawn method."""
    me, found = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                ppid = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, StopIteration):
            continue
        if ppid == me and b"multiprocessing" in cmdline and b"spawn_main" in cmdline:
            found.append(int(pid))
    return sorted(found)


def _sink_over_both_shares(tmp_path: Any, tables: list[str]) -> DeltaSink:
    """A lake whose table paths hash to both processes' shares (the database name is random, and
    three tables fall in one share a quarter of the time): both processes then apply tables."""
    for i in range(100):
        sink = DeltaSink(str(tmp_path / f"lake{i}"), owner="procs")
        if {share_of(sink.table_uri(t), 2) for t in tables} == {0, 1}:
            return sink
    raise AssertionError("no lake path spreads the tables over both shares")


@pytest.mark.timeout(600)
def test_processes_apply_a_stream_under_writes_and_a_killed_process_is_replaced(
    mariadb: Any, db: str, cdc_settings: Any, spark: Any, tmp_path: Any
) -> None:
    tables = make_tables(mariadb, db, rows=ROWS)
    store, sink = StateStore(str(tmp_path / "state"), "procs"), _sink_over_both_shares(tmp_path, tables)
    snapshot_tables(spark, cdc_settings, store, sink, tables, chunk_size=1000, chunks_per_group=2)
    before = set(_apply_processes())
    th = StreamThread(spark, cdc_settings, store, sink, run_id="procs-1",
                      options=StreamOptions(trigger_seconds=0.3, apply_processes=2)).start_running()  # fmt: skip
    writer = RandomWriter(mariadb, db, rate=150.0, seed=11, rows=ROWS)
    try:
        writer.start()
        deadline = time.monotonic() + 120
        while len(started := set(_apply_processes()) - before) < 2 and time.monotonic() < deadline:
            assert th.error is None, th.error
            time.sleep(0.2)
        assert len(started) == 2, f"expected 2 apply processes, found {sorted(started)}"
        time.sleep(3)
        victim = min(started)
        os.kill(victim, signal.SIGKILL)
        time.sleep(5)
        writer.stop_event.set()
        writer.join(timeout=30)
        assert writer.transactions > 300 and not writer.errors, writer.errors[:3]
        th.wait_applied(cdc_settings)
        assert th.error is None, th.error
        now = set(_apply_processes()) - before
        assert victim not in now and len(now) == 2, f"the killed process {victim} was not replaced: {sorted(now)}"
        for t in tables:
            assert_sink_equals_source(cdc_settings, sink, t)
    finally:
        writer.stop_event.set()
        th.stop_event.set()
        th.join(timeout=120)
    assert not set(_apply_processes()) - before, "the apply processes outlived the stream"
