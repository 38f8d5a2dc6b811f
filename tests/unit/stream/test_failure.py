"""The words a dead stream leaves in its status: which batch, and what to change."""

from __future__ import annotations

from typing import Any

from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import RUN, STATUS, stream_state
from airflow_provider_mysqlcdc.stream.failure import describe_batch, explain_stream_failure, jvm_gone

BATCH: dict[str, Any] = {
    "batch_id": 7,
    "start": {"file": "mysql-bin.000003", "pos": 4},
    "end": {"file": "mysql-bin.000003", "pos": 314_572_804},
    "binlog_bytes": 314_572_800,
    "phase": "decoding",
    "rows_decoded": 412_000,
}


def _store(tmp_path: Any, current: dict[str, Any] | None) -> StateStore:
    store = StateStore(str(tmp_path), "p")
    store.write_json(STATUS, {"batch_id": 6, **({"current_batch": current} if current else {})})
    return store


def test_a_vanished_jvm_is_named_with_its_batch_and_the_memory_to_raise(tmp_path) -> None:  # type: ignore[no-untyped-def]
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as inner:
            raise RuntimeError("the stream failed: [Errno 111] Connection refused") from inner
    except RuntimeError as exc:
        msg = explain_stream_failure(exc, _store(tmp_path, BATCH), driver_memory="1g")
    assert "Spark driver JVM went away in batch 7" in msg
    assert "mysql-bin.000003:4 -> mysql-bin.000003:314572804" in msg
    assert "300.0 MiB of binlog" in msg and "412,000 rows decoded" in msg and "phase decoding" in msg
    assert "driver_memory" in msg and "(now 1g)" in msg and "nothing was lost" in msg


def test_python_out_of_memory_names_apply_memory_mb(tmp_path) -> None:  # type: ignore[no-untyped-def]
    msg = explain_stream_failure(MemoryError(), _store(tmp_path, {**BATCH, "phase": "folding"}))
    assert "apply_memory_mb" in msg and "batch 7" in msg and "phase folding" in msg


def test_other_errors_keep_their_own_message(tmp_path) -> None:  # type: ignore[no-untyped-def]
    exc = ValueError("the primary key of d.t changed")
    assert explain_stream_failure(exc, _store(tmp_path, BATCH)) == "the primary key of d.t changed"
    assert not jvm_gone(exc)
    assert jvm_gone(RuntimeError("py4j: Answer from Java side is empty"))
    assert describe_batch(None) == "between micro-batches"


def test_a_driver_gone_mid_batch_says_which_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket
    import subprocess
    import time

    dead = subprocess.Popen(["true"])
    dead.wait()
    store = _store(tmp_path, BATCH)
    store.write_json(RUN, {"run_id": "r", "state": "running", "pid": dead.pid, "host": socket.gethostname(),
                           "heartbeat_at": time.time()})  # fmt: skip
    st = stream_state(store)
    assert not st["running"] and st["state"] == "lost"
    assert f"driver process {dead.pid} on this host is gone" in st["reason"]
    assert "while running batch 7" in st["reason"] and "apply_memory_mb" in st["reason"]
    assert st["current_batch"]["batch_id"] == 7 and st["last_batch"] == {"batch_id": 6}


class Py4JJavaError(Exception):
    """Stands for py4j's: its class name is what the failure check looks at."""


def test_a_java_error_from_a_jvm_that_then_stops_answering_is_a_vanished_jvm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A JVM exiting on an OutOfMemoryError can answer the call in flight with a Java error that reads
    like a query error; if it no longer answers afterwards, it went away."""
    exc = Py4JJavaError("An error occurred while calling o128.lastProgress")
    gone = explain_stream_failure(exc, _store(tmp_path, BATCH), "1g", jvm_answers=lambda: False)
    assert "Spark driver JVM went away in batch 7" in gone and "o128.lastProgress" in gone
    alive = explain_stream_failure(exc, _store(tmp_path, BATCH), "1g", jvm_answers=lambda: True)
    assert alive == "An error occurred while calling o128.lastProgress"  # a query error keeps its own words
    asked = []
    plain = explain_stream_failure(ValueError("bad"), _store(tmp_path, BATCH), "1g", lambda: asked.append(1) or False)
    assert plain == "bad" and not asked  # only a Java error makes it ask


class _DyingJvm:
    """A driver JVM (as ``spark.sparkContext._jvm`` sees it) that answers until ``dies_at``."""

    def __init__(self, dies_at: float) -> None:
        self.dies_at = dies_at
        self.sparkContext = self
        self._jvm = self
        self.java = self
        self.lang = self
        self.System = self

    def currentTimeMillis(self) -> int:  # Java's name
        import time

        if time.monotonic() >= self.dies_at:
            raise ConnectionRefusedError(111, "Connection refused")
        return int(time.time() * 1000)


def test_a_jvm_still_running_its_shutdown_hooks_is_not_taken_for_alive() -> None:
    """Spark's uncaught-exception handler exits the JVM through its shutdown hooks, answering
    meanwhile: a JVM that stops answering within the grace went away; one answering throughout lives."""
    import time

    from airflow_provider_mysqlcdc.jobs.stream import _jvm_answers

    assert not _jvm_answers(_DyingJvm(time.monotonic() + 1.2), grace=3.0)
    assert _jvm_answers(_DyingJvm(time.monotonic() + 60), grace=1.0)
    assert not _jvm_answers(None)
    assert jvm_gone(RuntimeError("org.apache.arrow.memory.OutOfMemoryException: Failure allocating buffer."))
    assert jvm_gone(RuntimeError("io.netty.util.internal.OutOfDirectMemoryError: failed to allocate"))


def test_a_driver_log_out_of_memory_names_the_batch_when_the_driver_could_not(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The JVM's exit took the driver's Python with it before it could explain: the run record holds
    only the call that failed meanwhile, and the driver log's out-of-memory line (not the broken pipe
    and missing block after it) makes the reason."""
    import socket
    import subprocess
    import time

    from airflow_provider_mysqlcdc.core.stream_state import LaunchHandle
    from airflow_provider_mysqlcdc.stream.failure import last_error_in_log

    log = tmp_path / "driver.log"
    log.write_text(
        "26/11/26 13:24:37 ERROR Executor: Exception in task 0.0 in stage 0.0 (TID 0)\n"
        "org.apache.arrow.memory.OutOfMemoryException: Failure allocating buffer.\n"
        "\tat org.apache.arrow.memory.BaseAllocator.buffer(BaseAllocator.java:1)\n"
        "Caused by: io.netty.util.internal.OutOfDirectMemoryError: failed to allocate 268435456 byte(s)\n"
        "26/11/26 13:24:37 ERROR TaskSetManager: Task 0 in stage 0.0 failed 1 times; aborting job\n"
        "BrokenPipeError: [Errno 32] Broken pipe\n"
        "org.apache.spark.SparkException: Block broadcast_0 does not exist\n"
    )
    assert "OutOfDirectMemoryError" in (last_error_in_log(str(log)) or "")
    plain = tmp_path / "plain.log"
    plain.write_text("ValueError: one\nsome output\nRuntimeError: two\n")
    assert last_error_in_log(str(plain)) == "RuntimeError: two"

    store = _store(tmp_path, BATCH)
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.write_json(RUN, {"run_id": "r", "state": "failed", "pid": dead.pid, "host": socket.gethostname(),
                           "heartbeat_at": time.time(),
                           "error": "An error occurred while calling o128.lastProgress"})  # fmt: skip
    store.write_handle(LaunchHandle(run_id="r", log_path=str(log)))
    reason = stream_state(store)["reason"]
    assert "Spark driver JVM went away in batch 7" in reason and "OutOfDirectMemoryError" in reason, reason
    log.write_text("RuntimeError: the stream failed: a query error\n")
    assert "JVM went away" not in stream_state(store)["reason"]


def test_the_last_error_is_never_py4j_or_the_jvms_shutdown_noise(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A killed Python driver leaves its JVM complaining that py4j's peer went away and failing as it
    shuts down: consequences, not the cause. The driver's own last ERROR line, when there is one, is."""
    from airflow_provider_mysqlcdc.stream.failure import last_error_in_log

    log = tmp_path / "driver.log"
    log.write_text(
        "26/11/27 21:00:00 INFO MicroBatchExecution: Committed offsets for batch 4\n"
        "26/11/27 21:00:01 ERROR MicroBatchExecution: Query q terminated with error\n"
        "org.apache.spark.sql.execution.streaming.sources.ForeachBatchUserFuncException: [FOREACH_BATCH_USER_FUNCTION"
        "_ERROR] An error occurred in the user provided function in foreach batch sink. Reason: Error while sending a "
        "command. SQLSTATE: 39000\n"
        "Caused by: py4j.Py4JException: Received empty command\n"
        "\tat py4j.ClientServerConnection.readBlockingResponse(ClientServerConnection.java:1)\n"
        "26/11/27 21:00:01 INFO SparkContext: Invoking stop() from shutdown hook\n"
        "26/11/27 21:00:02 ERROR MicroBatchExecution: Query q terminated with error\n"
        "java.lang.NullPointerException: Cannot invoke \"DAGScheduler.cleanupQueryJobs(long)\"\n"
        "org.apache.spark.SparkException: Exception thrown in awaitResult: \n"
    )
    assert last_error_in_log(str(log)) is None
    own = ("2026-11-27 21:00:00,000 ERROR airflow_provider_mysqlcdc.jobs.stream: the stream's driver process 7 ended "
           "without a word")  # fmt: skip
    log.write_text(f"{own}\n" + log.read_text() + "py4j.protocol.Py4JNetworkError: Answer from Java side is empty\n")
    assert last_error_in_log(str(log)) == own
    log.write_text("ValueError: before the exit\n26/11/27 21:00:01 INFO SparkContext: Invoking stop() from shutdown "
                   "hook\njava.lang.NullPointerException: after it\n")  # fmt: skip
    assert last_error_in_log(str(log)) == "ValueError: before the exit"
