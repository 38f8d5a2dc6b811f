"""A detached driver's log gets its last words: straight from the driver, or from its watcher when
the driver is killed and can say nothing (real processes, no Spark)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

DRIVER = """
import os, signal, sys, time
from airflow_provider_mysqlcdc.stream.driver_log import driver_log
with driver_log(sys.argv[1]):
    print("driver: running", flush=True)
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    print("driver: done", flush=True)
"""


def _run(log: Path, how: str) -> subprocess.CompletedProcess[bytes]:
    """The driver with its output on a pipe, as spark-submit's JVM reads it."""
    return subprocess.run([sys.executable, "-c", DRIVER, str(log), how], capture_output=True, timeout=60)


def _lines(log: Path, want: int, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(lines := log.read_text().splitlines()) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


def test_a_driver_that_ends_normally_writes_straight_to_its_log_and_nothing_more(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text("launcher: started\n")
    done = _run(log, "normal")
    assert done.returncode == 0 and done.stdout == b""  # not through the pipe: straight into the log
    time.sleep(0.5)  # the watcher, told all is said, writes nothing
    assert log.read_text().splitlines() == ["launcher: started", "driver: running", "driver: done"]


def test_a_killed_driver_gets_one_error_line_from_its_watcher(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text("")
    killed = _run(log, "killed")
    assert killed.returncode == -9
    lines = _lines(log, 2)
    assert lines[0] == "driver: running" and len(lines) == 2, lines
    assert " ERROR airflow_provider_mysqlcdc.jobs.stream: the stream's driver process " in lines[1]
    assert "ended without a word: it was killed" in lines[1] and "Re-run the DAG" in lines[1]


@pytest.mark.parametrize("path", [None, "/nonexistent/driver.log"])
def test_no_log_on_this_machine_changes_nothing(path: str | None) -> None:
    from airflow_provider_mysqlcdc.stream.driver_log import driver_log

    pid, out = os.getpid(), os.readlink("/proc/self/fd/1")
    with driver_log(path):
        assert os.readlink("/proc/self/fd/1") == out
    assert os.getpid() == pid
