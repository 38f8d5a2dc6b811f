"""The detached launcher's wait: the run record decides, and a spark-submit that only submits may exit."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.core.stream_state import RunRecord
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.launcher import StreamLaunchError, wait_until_running


def _later(store: StateStore, record: RunRecord, after: float) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(after), store.write_run(record)), daemon=True)
    t.start()
    return t


def test_a_submitter_that_exits_0_in_cluster_mode_waits_for_the_driver(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    proc = subprocess.Popen(["true"])
    proc.wait()
    _later(store, RunRecord(run_id="r1", state="running", pid=1, host="driver-pod"), 1.0)
    run = wait_until_running(store, "r1", proc, None, timeout=30, submit_only=True)
    assert run["host"] == "driver-pod"


def test_a_submitter_that_exits_in_client_mode_is_a_failed_launch(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(StreamLaunchError, match="exited with code 0 before the stream ran"):
        wait_until_running(store, "r1", proc, None, timeout=30)


def test_a_failed_submit_in_cluster_mode_is_reported(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    proc = subprocess.Popen(["false"])
    proc.wait()
    with pytest.raises(StreamLaunchError, match="exited with code 1"):
        wait_until_running(store, "r1", proc, None, timeout=30, submit_only=True)
