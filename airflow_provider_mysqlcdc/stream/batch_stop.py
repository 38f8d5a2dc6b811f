"""Stopping the stream's query from inside a micro-batch as a stop, not as a failure.

A batch that meets a DDL the stream has not followed must apply nothing and must not be marked
committed: once the DDL is followed, the query restarts from its checkpoint and runs the same batch
again (``stream/schema_follow.py``). Raising from ``foreachBatch`` does that, but Spark then logs
the query as "terminated with error" with a traceback, and py4j logs the Python traceback too: a
routine event reads like a failure in the driver log.

So the batch asks the query loop (``stream/job.py``) to ``stop()`` the query and waits. ``stop()``
marks the query terminated and interrupts the query's thread, which is the thread serving this
callback (py4j pins a Python callback's calls to the JVM thread that made it: PySpark's default
pinned-thread mode; without it the batch is not interrupted and fails after
:data:`STOP_WAIT_SECONDS`, as it used to, only later); the batch's next call
into the JVM fails with that interrupt, and the batch raises it. Spark takes an interrupt after
``stop()`` for a normal stop (``StreamExecution.isInterruptedByStop`` reads the interrupted py4j
call in the Python error's text, SPARK-39218): nothing is logged as an error, and the batch is not
marked committed, exactly as when it raised. The text is kept to one short line: Spark matches it
with a backtracking pattern that overflows the thread's stack on a long one (a chained traceback
with the Java stack trace).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from airflow_provider_mysqlcdc.stream.schema_follow import SchemaChangeReached

log = logging.getLogger(__name__)

#: How long a batch waits for the query loop to stop the query before it fails instead (the loop
#: polls every second; a failed batch is followed all the same, only noisily).
STOP_WAIT_SECONDS = 120.0


#: How the batch's error names the interrupted call, in the words Spark looks for (module doc).
INTERRUPTED_CALL = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling Thread.sleep: java.lang.InterruptedException"
)


class StoppedBeforeDdl(SchemaChangeReached):
    """Raised by a batch that met an unfollowed DDL once its query was stopped: its cause, the
    interrupted JVM call, tells Spark the query was stopped rather than failed."""


def stop_for_ddl(
    jvm: Any, request_stop: Callable[[], None], reached: SchemaChangeReached, timeout: float = STOP_WAIT_SECONDS
) -> NoReturn:
    """Have the query stopped and raise once its thread is interrupted (module doc).

    ``jvm`` is the batch's py4j view of the JVM (``batch_df.sparkSession._jvm``); ``request_stop``
    makes the query loop call ``query.stop()``. Without an interrupt within ``timeout`` (nobody
    stopped the query) the batch fails with ``reached``, as it did before."""
    log.info("%s: stopping the query to follow it; the batch runs again afterwards", reached)
    request_stop()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            jvm.java.lang.Thread.sleep(100)
        except Exception as exc:  # py4j's Py4JJavaError carrying the JVM's exception
            if "java.lang.InterruptedException" in str(exc):
                raise StoppedBeforeDdl(f"{str(reached)[:200]}: stopped to follow it ({INTERRUPTED_CALL})") from None
            raise reached from exc
    raise reached


class _RoutineStops(logging.Filter):
    """Drops py4j's "exception while executing the Python Proxy" record of a :class:`StoppedBeforeDdl`."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StoppedBeforeDdl)


def quiet_routine_stops() -> None:
    """Keep py4j from logging a batch's routine stop as an error with a traceback (idempotent)."""
    py4j = logging.getLogger("py4j.clientserver")
    if not any(isinstance(f, _RoutineStops) for f in py4j.filters):
        py4j.addFilter(_RoutineStops())


__all__ = ["INTERRUPTED_CALL", "STOP_WAIT_SECONDS", "StoppedBeforeDdl", "quiet_routine_stops", "stop_for_ddl"]
