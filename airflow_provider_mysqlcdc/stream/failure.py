"""Why a stream died, in words that name the batch and the setting to change.

When Spark's driver JVM exits (``-XX:+ExitOnOutOfMemoryError``, the OOM killer, a ``kill -9``),
the Python side of the driver only sees its gateway socket refuse connections: a status saying
``[Errno 111] Connection refused`` tells an operator nothing. The running batch's offsets and
phase are in ``stream/status.json`` (``stream/batch_progress.py`` keeps them there while a batch
is large), so the failure can say which batch killed the stream and what to raise.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from airflow_provider_mysqlcdc.core.stream_state import StreamStatus
from airflow_provider_mysqlcdc.state import StateStore

_JVM_GONE_TEXT = (
    "connection refused",
    "answer from java side is empty",
    "error while sending or receiving",
    "error while receiving",
    "java gateway process exited",
    "outofmemoryerror",
    "outofmemoryexception",  # Arrow's, around netty's OutOfDirectMemoryError
    "outofdirectmemoryerror",
)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def jvm_gone(exc: BaseException) -> bool:
    """Does ``exc`` say the driver JVM went away (rather than a query error)?"""
    for e in _chain(exc):
        if isinstance(e, ConnectionRefusedError | ConnectionResetError | BrokenPipeError):
            return True
        if type(e).__name__ == "Py4JNetworkError":
            return True
        text = str(e).lower()
        if any(t in text for t in _JVM_GONE_TEXT):
            return True
    return False


def describe_batch(batch: dict[str, Any] | None) -> str:
    """``batch 7 (mysql-bin.000003:4 -> mysql-bin.000003:9004, 300.0 MiB of binlog, ...)``."""
    if not batch:
        return "between micro-batches"
    parts = []
    if batch.get("start") and batch.get("end"):
        s, e = batch["start"], batch["end"]
        parts.append(f"{s['file']}:{s['pos']} -> {e['file']}:{e['pos']}")
    if batch.get("binlog_bytes") is not None:
        parts.append(f"{batch['binlog_bytes'] / 2**20:.1f} MiB of binlog")
    if batch.get("rows_decoded"):
        parts.append(f"{batch['rows_decoded']:,} rows decoded")
    if batch.get("phase"):
        parts.append(f"phase {batch['phase']}")
    return f"batch {batch.get('batch_id')} ({', '.join(parts)})"


def explain_stream_failure(
    exc: BaseException,
    store: StateStore,
    driver_memory: str | None = None,
    jvm_answers: Callable[[], bool] | None = None,
) -> str:
    """The error a failed stream records in its run record (``mysqlcdc status`` shows it).

    ``jvm_answers`` asks the driver JVM for a trivial answer: a JVM exiting on an error (an
    OutOfMemoryError with ``ExitOnOutOfMemoryError``) can still send one last Java error for the
    call in flight, which reads like a query error; asked again, it no longer answers."""
    chain = _chain(exc)
    current = store.read_status().current_batch
    where = describe_batch(current)
    if any(isinstance(e, MemoryError) for e in chain):
        return (
            f"the stream's driver (Python) ran out of memory in {where}: lower apply_memory_mb (the memory it may "
            "use to fold one table's changes; --apply-memory-mb / StreamOptions.apply_memory_mb) or give the "
            "driver's machine or container more memory. The stream restarts from its checkpoint; nothing was lost"
        )
    java_error = any(type(e).__name__ == "Py4JJavaError" for e in chain)
    if not jvm_gone(exc) and not (java_error and jvm_answers is not None and not jvm_answers()):
        return str(exc)
    return _jvm_went_away(where, driver_memory, f"{type(exc).__name__}: {str(exc)[:200]}")


#: The words every explanation of a dead driver JVM starts with (:func:`names_dead_jvm`).
JVM_WENT_AWAY = "the Spark driver JVM went away"


def names_dead_jvm(error: str | None) -> bool:
    """Whether a recorded error already explains that the driver JVM died (so a log line adds nothing)."""
    return JVM_WENT_AWAY in (error or "")


def _jvm_went_away(where: str, driver_memory: str | None, detail: str) -> str:
    mem = f" (now {driver_memory})" if driver_memory else ""
    return (
        f"{JVM_WENT_AWAY} in {where}: most likely it ran out of memory (look for 'OutOfMemoryError' "
        "in the driver log) or it was killed. Raise the driver memory"
        f"{mem}: driver_memory= on MySqlCdcStreamOperator, spark-submit --driver-memory, or spark.driver.memory. "
        "If it keeps dying on the same batch, lower max_inline_bytes (--max-inline-bytes: task output beyond it is "
        "staged instead of sent to the driver) or max_bytes_per_trigger. The stream restarts from its checkpoint; "
        f"nothing was lost ({detail})"
    )


def explain_driver_log_error(line: str, status: StreamStatus | None) -> str | None:
    """The failure a driver log's error line explains (None: it explains nothing by itself).

    A JVM that runs out of memory exits through Spark's uncaught-exception handler and takes the
    driver's Python process with it, which then may record no more than the call that failed
    meanwhile ("An error occurred while calling o128.lastProgress"); the JVM's own log line says why.
    """
    if not any(m in line for m in _MEMORY_MARKS):
        return None
    where = describe_batch(None if status is None else status.current_batch)
    return _jvm_went_away(where, None, f"driver log: {line[:200]}")


def explain_lost_driver(reason: str, status: StreamStatus | None) -> str:
    """``stream_state``'s reason for a driver that vanished without a word, with the batch it was
    running and what most likely ended it."""
    current = None if status is None else status.current_batch
    if not current:
        return f"{reason}: it was killed (kill -9, or the system for memory: see dmesg) or crashed"
    return (
        f"{reason}, while running {describe_batch(current)}: if the system killed it for memory (dmesg: 'Out of "
        "memory: Killed process'), lower apply_memory_mb or give the driver more memory; the stream restarts "
        "from its checkpoint"
    )


_LOG_ERROR_MARKS = ("OutOfMemoryError", "Terminating due to", "error: ", "Error: ", "Exception: ", "Killed")
#: The driver's own last words (``jobs/stream.py`` logs why it stopped as one ERROR line).
_OWN_ERROR = re.compile(r" (ERROR|CRITICAL) airflow_provider_mysqlcdc[\w.]*: ")
#: Driver log lines that are never why a stream died: py4j saying the other side of the gateway went
#: away (a symptom of a dead driver process or JVM), and a batch stopping before a DDL (routine).
_NOT_A_CAUSE = ("py4j", "Python Proxy", "Received empty command", "Answer from Java side is empty",
                "Error while sending a command", "Error while obtaining a new communication channel",
                "SchemaChangeReached", "StoppedBeforeDdl")  # fmt: skip
#: Spark's shutdown hook starts: whatever the JVM logs after it is a consequence of its exit.
_JVM_EXITING = "Invoking stop() from shutdown hook"
#: Driver log lines that say the JVM ran out of memory (heap, or the direct memory Arrow allocates).
_MEMORY_MARKS = ("OutOfMemoryError", "OutOfMemoryException", "OutOfDirectMemoryError")


def last_error_in_log(path: str, tail_bytes: int = 256 * 1024) -> str | None:
    """The line of a driver log that looks like the error that ended it (None if none): the last
    one saying the JVM ran out of memory, else the driver's own last ERROR line (why it stopped, in
    its words), else the last error line before the JVM began to exit.

    A driver killed from outside (the OOM killer, ``kill -9``) records nothing itself; its log on
    this host often still says why (the JVM's ``Terminating due to java.lang.OutOfMemoryError``).
    An out-of-memory error wins over the errors after it, which are its consequences (a broken
    pipe to a Python worker, a missing broadcast block); py4j's complaints about a vanished peer and
    what Spark logs while its shutdown hook stops it are consequences too, never quoted.
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return None
    lines = [ln for ln in lines if ln and not ln.startswith("at ")]
    memory = [ln for ln in lines if any(m in ln for m in _MEMORY_MARKS)]
    if memory:
        return memory[-1][:400]
    own = [ln for ln in lines if _OWN_ERROR.search(ln)]
    if own:
        return own[-1][:400]
    exiting = next((i for i in range(len(lines) - 1, -1, -1) if _JVM_EXITING in lines[i]), len(lines))
    for text in reversed(lines[:exiting]):
        if any(m in text for m in _LOG_ERROR_MARKS) and not any(m.lower() in text.lower() for m in _NOT_A_CAUSE):
            return text[:400]
    return None


__all__ = [
    "JVM_WENT_AWAY",
    "describe_batch",
    "explain_driver_log_error",
    "explain_lost_driver",
    "explain_stream_failure",
    "jvm_gone",
    "last_error_in_log",
    "names_dead_jvm",
]
