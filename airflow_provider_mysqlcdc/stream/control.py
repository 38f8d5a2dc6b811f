"""Control of a running stream through the state store: its run record, heartbeat, stop requests.

A detached stream lives beyond the Airflow task that launched it, possibly on another machine (a
YARN or Kubernetes driver), so the only channel every party shares is the state store. The stream's
driver writes ``stream/run.json`` (run id, state, pid/host, heartbeat, committed offset) every few
seconds; whoever wants it to stop writes ``stream/stop-request.json`` and the driver stops after
its running micro-batch, so the checkpoint ends at a batch boundary. Signals are only a fallback for
a driver that no longer reads the store (same host only).

Airflow-free: the operators, the deferrable trigger and the ``status``/``stop`` CLI share this.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import replace
from typing import Any

from airflow_provider_mysqlcdc.core.manifest import DEFAULT_CHECKPOINT, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.stream_state import LaunchHandle, ReloadRequest, RunRecord, StopRequest

# the documents' paths, re-exported: the stream's modules, tests and tools import them from here
from airflow_provider_mysqlcdc.state import HANDLE, RELOAD, RUN, SCHEMA_CHANGE, STATUS, STOP_REQUEST, StateStore  # noqa: F401

log = logging.getLogger(__name__)

STAGED = "stream/staged"  # change blocks of large batches, on their way from the tasks to the driver
HEARTBEAT_SECONDS = 5.0
STALE_AFTER_SECONDS = 45.0
LIVE_STATES = ("starting", "running", "stopping", "paused")
#: How long a paused stream waits for the hand-over to finish before it stops itself (the run that
#: paused it died half-way: the next run's stream operator restarts the stream).
PAUSE_TIMEOUT_SECONDS = 1800.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited child nobody reaped) still answers kill(0)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (None: no such process, or no /proc).
    A later process given the same pid has another start."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_space() -> str | None:
    """This process's boot and pid namespace (None: no /proc): two processes with the same value see
    the same pids. Two containers may share a host name, never this."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{f.read().strip()}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def driver_on_this_host(run: RunRecord) -> bool:
    """Whether the driver's pid can be checked here: same host name and, when both are known, the
    same boot and pid namespace."""
    if not run.pid or run.host != socket.gethostname():
        return False
    here = process_space()
    return run.pid_space is None or here is None or run.pid_space == here


def driver_process_alive(run: RunRecord) -> bool:
    """Whether the driver's process (on this host: :func:`driver_on_this_host`) still runs."""
    pid = int(run.pid or 0)
    if not pid or not _pid_alive(pid):
        return False
    started = process_start(pid)
    return run.pid_start is None or started is None or started == run.pid_start


class StreamRunRecorder:
    """Written by the stream's driver: the run record and heartbeat, and the stop-request check."""

    def __init__(self, store: StateStore, run_id: str):
        self.store = store
        self.run_id = run_id
        self.started_at = time.time()
        self.record = RunRecord(
            run_id, "starting", os.getpid(), socket.gethostname(), self.started_at, self.started_at,
            pid_start=process_start(os.getpid()), pid_space=process_space(),
        )
        self._last_beat = 0.0

    def write(self, **changes: Any) -> None:
        """Update the run record's fields (``RunRecord``'s names) and write it with a new heartbeat."""
        self.record = replace(self.record, **changes, heartbeat_at=time.time())
        self.store.write_run(self.record)
        self._last_beat = time.monotonic()

    def heartbeat_due(self) -> bool:
        return time.monotonic() - self._last_beat >= HEARTBEAT_SECONDS

    def heartbeat(self, committed: BinlogOffset | None, force: bool = False) -> None:
        if force or self.heartbeat_due():
            self.write(committed_offset=None if committed is None else committed.to_dict())

    def reload_requested(self) -> ReloadRequest | None:
        """A pending hand-over request addressed to this run (see :func:`pause_stream`), if any."""
        req = self.store.read_reload()
        if req is None or not req.requested:
            return None
        if req.run_id not in (None, self.run_id):
            return None
        return req

    def stop_requested(self) -> bool:
        req = self.store.read_stop_request()
        if req is None:
            return False
        return (req.run_id in (None, self.run_id)) and req.requested_at >= self.started_at - 5


#: What brings a stream that is not running back (docs/architecture.md, "Liveness").
RESTART_FIX = "re-run the DAG: its stream task restarts the stream from its checkpoint (nothing is lost)"


def stream_state(store: StateStore) -> dict[str, Any]:
    """What is known about the pipeline's stream: alive or not, why, its offsets and last batch.

    A stream that is not running has no lag (``lag_seconds`` None: the last batch's lag says nothing
    about a lake that no longer moves); ``last_batch_age_seconds`` says how old the last report is."""
    found_run = store.read_run()
    run = found_run or RunRecord()
    status = store.read_status()
    handle = store.read_handle() or LaunchHandle()
    now = time.time()
    state = run.state
    age = None if found_run is None else round(now - run.heartbeat_at, 1)
    running, reason = False, None
    if found_run is not None and state in LIVE_STATES:
        running, reason = _liveness(run, age or 0.0)
    if reason:
        from airflow_provider_mysqlcdc.stream.failure import explain_lost_driver

        reason = explain_lost_driver(reason, status)
    if not running and state in (*LIVE_STATES, "failed") and handle.log_path:
        from airflow_provider_mysqlcdc.stream.failure import explain_driver_log_error, last_error_in_log, names_dead_jvm

        found = last_error_in_log(handle.log_path)
        explained = None if found is None else explain_driver_log_error(found, status)
        if explained and not names_dead_jvm(run.error):
            reason = explained
        elif found and state == "failed" and found not in str(run.error or ""):
            # a driver that vanished without a word (lost) leaves only its JVM's consequences in the log
            reason = f"{run.error or 'the stream failed'} — last error in its driver log: {found}"
    reported = status.batch.get("updated_at")
    return {
        "running": running,
        "state": state if running or state not in LIVE_STATES else "lost",
        "reason": reason or run.error,
        "run_id": run.run_id,
        "pid": run.pid,
        "host": run.host,
        "on_this_host": found_run is not None and driver_on_this_host(run),
        "started_at": run.started_at,
        "heartbeat_age_seconds": age,
        "committed_offset": run.committed_offset,
        "last_batch": status.last_batch(),
        "current_batch": status.current_batch,
        "lag_seconds": status.lag_seconds if running else None,
        "last_batch_age_seconds": None if not reported else round(now - float(reported), 1),
        "log_path": handle.log_path,
        "launcher_pid": handle.launcher_pid,
    }


def _liveness(run: RunRecord, age: float) -> tuple[bool, str | None]:
    """(running, why not) for a run record that says its stream lives (docs/architecture.md, "Liveness").

    A driver on this host is exactly as alive as its process: a killed one is lost at once, and one
    whose process lives is never declared lost for a late heartbeat (a starved machine delays them;
    declaring it lost would start a second stream). Elsewhere the heartbeat is all there is."""
    if driver_on_this_host(run):
        if driver_process_alive(run):
            return True, None
        return False, f"its driver process {run.pid} on this host is gone without a word (heartbeat {age:.0f}s ago)"
    if age < STALE_AFTER_SECONDS:
        return True, None
    return False, (
        f"its driver on {run.host} sent no heartbeat for {age:.0f}s (lost after {STALE_AFTER_SECONDS:.0f}s) and "
        "recorded nothing"
    )


def request_stop(store: StateStore, timeout: float = 300.0, force_after_timeout: bool = True) -> dict[str, Any]:
    """Ask the stream to stop after its running batch; wait until it has. Returns its final state.

    A stream that does not confirm within ``timeout`` (hung, or a driver that cannot read the
    store) is sent SIGTERM, then SIGKILL, when it runs on this host and ``force_after_timeout``:
    the checkpoint and the sink's per-batch transaction ids make even a hard kill lose nothing.
    """
    st = stream_state(store)
    if not st["running"]:
        store.delete(STOP_REQUEST)
        log.info("stream of %s is not running (%s)", store.pipeline_id, st["state"] or "never started")
        return {**st, "stopped": False}
    run_id = st["run_id"]
    store.write_stop_request(StopRequest(run_id, time.time(), socket.gethostname()))
    log.info("asked stream %s (run %s) to stop after its running batch", store.pipeline_id, run_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = stream_state(store)
        if not st["running"]:
            break
        time.sleep(0.5)
    else:
        if not force_after_timeout:
            raise TimeoutError(f"stream {store.pipeline_id} did not stop within {timeout:.0f}s")
        _force_stop(st)
        st = stream_state(store)
    store.delete(STOP_REQUEST)
    log.info("stream %s stopped: %s, committed offset %s", store.pipeline_id, st["state"], st["committed_offset"])
    return {**st, "stopped": True}


def _force_stop(st: dict[str, Any]) -> None:
    if not st.get("on_this_host"):  # its pids are not this machine's (or this container's) to signal
        raise TimeoutError(
            f"the stream (run {st.get('run_id')}) on host {st.get('host')} did not stop within the timeout; stop its "
            "Spark application with your cluster's tools (yarn application -kill / kubectl delete pod)"
        )
    for sig, wait in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        for pid in (st.get("pid"), st.get("launcher_pid")):
            if pid and _pid_alive(int(pid)):
                log.warning("stream did not stop in time: sending %s to %s", sig.name, pid)
                try:
                    os.kill(int(pid), sig) if sig == signal.SIGTERM else os.killpg(os.getpgid(int(pid)), sig)
                except (ProcessLookupError, PermissionError):
                    pass
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if not any(p and _pid_alive(int(p)) for p in (st.get("pid"), st.get("launcher_pid"))):
                return
            time.sleep(0.5)


def pause_stream(store: StateStore, timeout: float = 300.0) -> dict[str, Any]:
    """Ask the running stream to pause after its running batch, for a manifest hand-over.

    The stream's Spark application stays up: after :func:`resume_stream` it restarts its query with
    the new manifest in a second or two, instead of a ``spark-submit`` restart that leaves every
    table unstreamed for tens of seconds. Returns ``{"paused": True, "reload_id", "committed_offset"}``
    once the stream confirms; a stream that is not running gives ``{"paused": False}``, and one
    that does not confirm in ``timeout`` is stopped instead (``{"paused": False, "stopped": True}``).
    """
    st = stream_state(store)
    if not st["running"]:
        return {"paused": False, "stopped": False}
    reload_id = uuid.uuid4().hex[:12]
    store.write_reload(ReloadRequest(reload_id, st["run_id"], "requested", time.time()))
    log.info("asked stream %s (run %s) to pause after its running batch for a hand-over", store.pipeline_id,
             st["run_id"])  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = store.read_run() or RunRecord()
        if run.state == "paused" and run.reload_id == reload_id:
            return {"paused": True, "reload_id": reload_id, "committed_offset": run.committed_offset}
        st = stream_state(store)
        if not st["running"]:
            store.delete(RELOAD)
            return {"paused": False, "stopped": True, "state": st["state"]}
        time.sleep(0.2)
    log.warning("the stream did not pause within %.0fs: stopping it instead", timeout)
    store.delete(RELOAD)
    out = request_stop(store, timeout=timeout)
    return {"paused": False, "stopped": True, "state": out.get("state")}


def resume_stream(store: StateStore, reload_id: str, timeout: float = 300.0) -> dict[str, Any]:
    """Let a paused stream restart its query with the current manifest; wait until it runs again."""
    req = store.read_reload()
    if req is None or req.reload_id != reload_id:
        found = "none" if req is None else req.to_dict()
        raise RuntimeError(f"the hand-over {reload_id} is not pending any more (found {found})")
    store.write_reload(replace(req, state="ready", ready_at=time.time()))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = store.read_run() or RunRecord()
        if run.state == "running" and run.reloaded == reload_id:
            return stream_state(store)
        st = stream_state(store)
        if not st["running"]:
            raise RuntimeError(f"the stream did not resume after the hand-over: {st['state']} ({st['reason']})")
        time.sleep(0.2)
    raise TimeoutError(f"the stream did not resume within {timeout:.0f}s after the hand-over")


def checkpoint_dir(store: StateStore, manifest: Manifest | None = None) -> str:
    """The current stream generation's checkpoint directory (relative to the pipeline's state).

    A stream generation starts when tables are handed over while the stream ran past their
    snapshot's high watermarks (``pipeline.finalize_run``): it reads from an earlier offset than the
    old checkpoint, so it gets a checkpoint (and Delta transaction app id) of its own.
    """
    m = manifest if manifest is not None else store.read_manifest()
    return m.generation.checkpoint if m is not None else DEFAULT_CHECKPOINT


def checkpoint_offset(store: StateStore, manifest: Manifest | None = None) -> BinlogOffset | None:
    """The end offset of the last micro-batch the checkpoint marks committed (None: no checkpoint).

    Spark's checkpoint keeps ``offsets/<batch>`` (written before a batch runs: version line,
    metadata line, then one line per source) and ``commits/<batch>`` (written after it finished).
    """
    ckpt = checkpoint_dir(store, manifest)
    commits = [int(n) for n in store.list(f"{ckpt}/commits") if n.isdigit()]
    if not commits:
        return None
    return _logged_end_offset(store, ckpt, max(commits))


def batch_offsets(store: StateStore, manifest: Manifest, batch_id: int) -> tuple[BinlogOffset, BinlogOffset] | None:
    """``(start, end)`` of micro-batch ``batch_id`` from the checkpoint's offset log (Spark writes
    it before the batch runs); None if the log does not have it."""
    ckpt = checkpoint_dir(store, manifest)
    try:
        end = _logged_end_offset(store, ckpt, batch_id)
        if batch_id > 0 and store.exists(f"{ckpt}/offsets/{batch_id - 1}"):
            start = _logged_end_offset(store, ckpt, batch_id - 1)
        else:
            start = manifest.start_offset
    except (OSError, ValueError, KeyError):
        return None
    return start, end


def _logged_end_offset(store: StateStore, ckpt: str, batch: int) -> BinlogOffset:
    with store.fs.open(store.path(f"{ckpt}/offsets/{batch}"), "r") as f:
        lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    if len(lines) < 3:
        raise ValueError(f"unexpected checkpoint offsets file for batch {batch}: {lines!r}")
    return BinlogOffset.from_dict(json.loads(lines[2]))


def watch_condition(
    state: dict[str, Any], target: BinlogOffset | None, max_lag_seconds: float | None
) -> tuple[bool, str | None]:
    """(done, error) for a watcher: an error if the stream is not running; done once the committed
    offset reached ``target`` (when given) and the lag is at most ``max_lag_seconds`` (when given)."""
    if not state["running"]:
        return False, (
            f"the stream is not running (state {state['state'] or 'never started'}"
            + (f": {state['reason']}" if state.get("reason") else "")
            + f"). {RESTART_FIX[0].upper()}{RESTART_FIX[1:]}"
            + (f"; its driver log: {state['log_path']}" if state.get("log_path") else "")
        )
    if target is not None:
        committed = state.get("committed_offset")
        if not committed or BinlogOffset.from_dict(committed) < target:
            return False, None
    if max_lag_seconds is not None:
        lag = state.get("lag_seconds")
        if lag is None or lag > max_lag_seconds:
            return False, None
    return True, None


def wait_until_applied(store: StateStore, target: BinlogOffset, timeout: float = 300.0) -> dict[str, Any]:
    """Block until the running stream's committed offset reaches ``target``; raise if it stops."""
    deadline = time.monotonic() + timeout
    while True:
        st = stream_state(store)
        done, error = watch_condition(st, target, None)
        if error:
            raise RuntimeError(error)
        if done:
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"stream {store.pipeline_id} did not reach {target} within {timeout:.0f}s "
                f"(committed {st['committed_offset']}, last batch {st['last_batch']})"
            )
        time.sleep(0.5)


def _fix(st: dict[str, Any]) -> str | None:
    """What to do about a stream that is not running (None while it runs)."""
    if st["running"] or st["state"] is None:
        return None
    return ("fix what stream_reason says, then " if st["state"] == "failed" else "") + RESTART_FIX


def pipeline_status(store: StateStore, server_offset: BinlogOffset | None = None) -> dict[str, Any]:
    """One JSON-able picture of the pipeline: stream state, offsets, lag, each table's phase."""
    st = stream_state(store)
    manifest = store.read_manifest()
    pointer = store.read_plan_pointer()
    ckpt = checkpoint_offset(store, manifest)
    tables: dict[str, str] = {}
    for t in manifest.tables if manifest else {}:
        tables[t] = "streaming" if st["running"] else f"captured (stream {st['state'] or 'not started'})"
    if pointer is not None and not pointer.finalized:
        for t in pointer.tables:
            tables[t] = "snapshotting"
    committed = st.get("committed_offset") or (None if ckpt is None else ckpt.to_dict())
    behind = None
    if server_offset is not None and committed is not None:
        behind = BinlogOffset.from_dict(committed) < BinlogOffset(server_offset.file, server_offset.pos)
    return {
        "pipeline_id": store.pipeline_id,
        "stream_running": st["running"],
        "stream_state": st["state"],
        "stream_reason": st["reason"],
        "stream_fix": _fix(st),
        "run_id": st["run_id"],
        "committed_offset": committed,
        "server_offset": None if server_offset is None else server_offset.to_dict(),
        "behind_server": behind,
        # None when the stream is not running and behind (or the source unknown): see stream_state
        "lag_seconds": 0.0 if behind is False else st["lag_seconds"],
        "last_batch_age_seconds": st["last_batch_age_seconds"],
        "heartbeat_age_seconds": st["heartbeat_age_seconds"],
        "last_batch": st["last_batch"],
        # a long micro-batch (a huge transaction): its offsets, binlog bytes, phase, rows decoded so far
        "current_batch": st.get("current_batch"),
        "current_plan": None if pointer is None else pointer.to_dict(),
        "tables": tables,
        "log_path": st["log_path"],
    }
