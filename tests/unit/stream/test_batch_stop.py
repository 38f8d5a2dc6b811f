"""A batch that met a DDL stops its query as a stop: the error it raises reads, to Spark, as the
interrupt of ``stop()``, in words short enough for Spark's pattern; py4j does not log it."""

from __future__ import annotations

import logging
import re
import traceback

import pytest

from airflow_provider_mysqlcdc.stream.batch_stop import (
    INTERRUPTED_CALL,
    StoppedBeforeDdl,
    quiet_routine_stops,
    stop_for_ddl,
)
from airflow_provider_mysqlcdc.stream.schema_follow import SchemaChangeReached

#: Spark's StreamExecution.PROXY_ERROR: how it tells an interrupted py4j call in a Python error's text.
PROXY_ERROR = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException|java.nio.channels.ClosedByInterruptException)"
)


class _Jvm:
    """The batch's view of the JVM: ``Thread.sleep`` fails as Java's does once the thread is interrupted."""

    def __init__(self) -> None:
        self.java, self.lang, self.Thread = self, self, self
        self.interrupted = False
        self.sleeps = 0

    def sleep(self, millis: int) -> None:
        self.sleeps += 1
        if self.interrupted:
            raise RuntimeError(
                "An error occurred while calling z:java.lang.Thread.sleep.\n: java.lang.InterruptedException: sleep "
                "interrupted\n" + "\tat java.base/java.lang.Thread.sleep(Native Method)\n" * 40
            )


def test_the_batch_raises_the_stops_interrupt_in_words_spark_reads_as_a_stop() -> None:
    jvm = _Jvm()
    reached = SchemaChangeReached("ALTER of d.t at mysql-bin.000001:8035")

    def stop_the_query() -> None:
        jvm.interrupted = True

    with pytest.raises(StoppedBeforeDdl) as raised:
        stop_for_ddl(jvm, stop_the_query, reached)
    text = "".join(traceback.format_exception(raised.value))  # what py4j sends the JVM
    found = PROXY_ERROR.search(text)
    assert found is not None and "ALTER of d.t" in str(raised.value)
    # Spark's pattern recurses once per character after the match's start: a long tail (a chained
    # traceback with the Java stack) overflows its thread's stack, so the tail stays one short line
    assert len(text) - found.start() < 300 and INTERRUPTED_CALL in text
    assert "During handling" not in text and "direct cause" not in text


def test_a_query_nobody_stops_fails_the_batch_as_before() -> None:
    reached = SchemaChangeReached("ALTER of d.t at mysql-bin.000001:8035")
    with pytest.raises(SchemaChangeReached) as raised:
        stop_for_ddl(_Jvm(), lambda: None, reached, timeout=0.3)
    assert raised.value is reached and not isinstance(raised.value, StoppedBeforeDdl)


def test_py4j_does_not_log_a_routine_stop_but_logs_real_errors(caplog: pytest.LogCaptureFixture) -> None:
    quiet_routine_stops()
    quiet_routine_stops()  # once is enough, twice is harmless
    py4j = logging.getLogger("py4j.clientserver")
    assert sum(type(f).__name__ == "_RoutineStops" for f in py4j.filters) == 1
    with caplog.at_level(logging.INFO, logger="py4j.clientserver"):
        for exc in (StoppedBeforeDdl("routine"), ValueError("real")):
            try:
                raise exc
            except Exception:
                py4j.exception("There was an exception while executing the Python Proxy on the Python Side.")
    assert [r.exc_info[1].args[0] for r in caplog.records if r.exc_info] == ["real"]
