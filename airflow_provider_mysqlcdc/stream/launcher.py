"""Start a stream job that outlives the Airflow task that starts it, and wait until it runs.

In ``local[*]`` or client mode the Spark driver is the ``spark-submit`` process itself, so a
detached stream is a ``spark-submit`` in its own session (no controlling task, stdin closed,
output to a log file), recorded in ``stream/handle.json``. The launch is confirmed only when the
driver reports ``running`` in its run record, so a stream that fails at start (purged binlog, bad
manifest, no JDBC jar) fails the task with the driver's own message instead of "launched".
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_provider_mysqlcdc.core.stream_state import LaunchHandle
from airflow_provider_mysqlcdc.state import StateStore

log = logging.getLogger(__name__)

#: Names the driver log of a detached launch to the job, which writes its own lines straight into it
#: (``jobs/stream.py``): spark-submit pipes the Python driver's output through the JVM, so what it
#: says after the JVM died (why it stops) would be lost.
DRIVER_LOG_ENV = "MYSQLCDC_DRIVER_LOG"


class StreamLaunchError(RuntimeError):
    """The stream did not start; the message carries the driver's error or its log's last lines."""


def log_path_for(store: StateStore, run_id: str) -> str:
    if store.protocol in ("file", "local"):
        d = Path(store.path("stream", "logs"))
    else:  # the state store is remote: keep the driver log on this worker
        d = Path(tempfile.gettempdir()) / "mysqlcdc" / store.pipeline_id
    d.mkdir(parents=True, exist_ok=True)
    return str(d / f"stream-{run_id}.log")


def _tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def launch_detached(
    store: StateStore, cmd: list[str], env: dict[str, str], run_id: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Start ``cmd`` (a spark-submit command line) in its own session; record and return its handle."""
    path = log_path_for(store, run_id)
    return record_detached(store, start_detached(cmd, env, path), run_id, path, extra)


def start_detached(cmd: list[str], env: dict[str, str], log_path: str, **popen_kwargs: Any) -> subprocess.Popen:
    """Start ``cmd`` in its own session, output appended to ``log_path``: it outlives the caller."""
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env={**env, DRIVER_LOG_ENV: log_path},
            start_new_session=True,
            close_fds=True,
            **popen_kwargs,
        )


def record_detached(
    store: StateStore, proc: subprocess.Popen, run_id: str, log_path: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Record the handle of a detached stream started by ``proc`` (``stream/handle.json``) and return
    it, with the process under ``_proc`` for :func:`wait_until_running`."""
    handle = LaunchHandle.from_dict({
        **LaunchHandle(run_id, "detached", proc.pid, socket.gethostname(), log_path, time.time()).to_dict(),
        **(extra or {}),
    })  # fmt: skip
    store.write_handle(handle)
    log.info("launched the stream (run %s, spark-submit pid %d); driver log: %s", run_id, proc.pid, log_path)
    return {**handle.to_dict(), "_proc": proc}


def wait_until_running(
    store: StateStore, run_id: str, proc: subprocess.Popen | None = None, log_path: str | None = None,
    timeout: float = 300.0, submit_only: bool = False,
) -> dict[str, Any]:
    """Block until the run record of ``run_id`` says running; raise with the driver's error if it fails.

    ``submit_only``: spark-submit only submits the driver to the cluster (cluster deploy mode) and
    exits 0 once it is accepted; the run record is then the only sign of the driver."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = store.read_run()
        if run is not None and run.run_id == run_id:
            if run.state == "running":
                return run.to_dict()
            if run.state in ("failed", "stopped"):
                raise StreamLaunchError(
                    f"the stream {run.state} at start: {run.error or 'see its log'}"
                    + (f" (driver log: {log_path})" if log_path else "")
                )
        if proc is not None and proc.poll() is not None and not (submit_only and proc.returncode == 0):
            raise StreamLaunchError(
                f"spark-submit exited with code {proc.returncode} before the stream ran; last lines of "
                f"{log_path}:\n{_tail(log_path) if log_path else ''}"
            )
        time.sleep(0.5)
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, 9)
    raise StreamLaunchError(
        f"the stream did not report running within {timeout:.0f}s; last lines of {log_path}:\n"
        f"{_tail(log_path) if log_path else ''}"
    )
