"""A detached stream's driver log gets the driver's last words, however the driver ends.

Two ways it would not: spark-submit pipes a Python driver's output through the JVM, so what the
driver writes after its JVM died — why it stops — is lost; and a driver killed outright (``kill -9``,
the OOM killer) writes nothing, leaving the JVM's shutdown noise as the log's last lines. So the
driver writes its output straight into the log (the launcher names it in ``DRIVER_LOG_ENV``:
``stream/launcher.py``), and a small process forked at its start, before any thread, waits for the
driver's end: a driver that ends without saying it is done gets one ERROR line in its log from it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator

from airflow_provider_mysqlcdc.stream.control import RESTART_FIX

#: The words of a driver that ended without a word (``mysqlcdc status`` gives the same reason).
SILENT_END = (
    "the stream's driver process {pid} ended without a word: it was killed (kill -9, or the system for memory: "
    f"see dmesg) or crashed. {RESTART_FIX[0].upper()}{RESTART_FIX[1:]}"
)
_DONE = b"done"


@contextlib.contextmanager
def driver_log(path: str | None, logger_name: str = "airflow_provider_mysqlcdc.jobs.stream") -> Iterator[None]:
    """Within: this process writes its output straight into the driver log ``path``, and a driver
    that dies without leaving this block gets :data:`SILENT_END` there. Nothing is done where the
    log is not on this machine (cluster deploy mode) or no log was named."""
    if not path or not os.path.isfile(path):
        yield
        return
    _write_straight_to(path)
    done = _watch_for_a_silent_end(logger_name)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.write(done, _DONE)
            os.close(done)


def _write_straight_to(path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def _watch_for_a_silent_end(logger_name: str) -> int:
    """Fork the watcher; the write end of its pipe (the driver writes :data:`_DONE` when it ends
    having said why). The watcher reads until the driver's end closes the pipe."""
    driver = os.getpid()
    read_end, write_end = os.pipe()  # not inherited by processes the driver spawns
    if os.fork() != 0:
        os.close(read_end)
        return write_end
    try:  # the watcher: outlives a SIGTERM to the group, so it sees how the driver ends
        os.close(write_end)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        said = b""
        while chunk := os.read(read_end, 16):
            said += chunk
        if said != _DONE:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() * 1000) % 1000:03d}"
            line = f"{stamp} ERROR {logger_name}: {SILENT_END.format(pid=driver)}\n"
            os.write(2, line.encode())
    finally:
        os._exit(0)


__all__ = ["SILENT_END", "driver_log"]
