"""The stream's control documents: exact JSON shapes, records of earlier versions, unknown keys kept."""

from __future__ import annotations

from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.stream_state import (
    LaunchHandle,
    PendingDdl,
    ReloadRequest,
    RunRecord,
    SchemaChange,
    StopRequest,
    StreamStatus,
)

RUN = {"run_id": "r", "state": "running", "pid": 12, "host": "h", "started_at": 1.0, "heartbeat_at": 2.0,
       "committed_offset": {"file": "b.000001", "pos": 4}, "error": None}  # fmt: skip


def test_run_record_round_trip():
    assert RunRecord.from_dict(RUN).to_dict() == RUN
    paused = {**RUN, "state": "paused", "reload_id": "x", "reloaded": "w", "future": [1]}
    rec = RunRecord.from_dict(paused)
    assert rec.to_dict() == paused and rec.reload_id == "x" and rec.extra == {"future": [1]}
    assert rec.committed() == BinlogOffset("b.000001", 4)


def test_run_record_of_an_earlier_version_reads():
    rec = RunRecord.from_dict({"run_id": "r", "state": "running", "pid": 1, "host": "h"})
    assert rec.heartbeat_at == 0.0 and rec.committed() is None and rec.reload_id is None


def test_status_round_trip_and_views():
    batch = {"batch_id": 6, "rows": 3, "rows_per_table": {"db.t": 3}, "last_event": {"file": "b.1", "pos": 9},
             "lag_seconds": None, "updated_at": 5.0, "seconds": 0.2}  # fmt: skip
    done = StreamStatus.finished(6, 3, {"db.t": 3}, BinlogOffset("b.1", 9), None, 0.2, 5.0)
    assert done.to_dict() == batch and done.batch_id == 6 and done.lag_seconds is None
    full = {**batch, "bounded_apply": {"db.t": {}}, "maintenance": {"at": 1.0, "tables": {}},
            "current_batch": {"batch_id": 7, "phase": "decoding"}}  # fmt: skip
    st = StreamStatus.from_dict(full)
    assert st.to_dict() == full
    assert st.last_batch() == {k: v for k, v in full.items() if k != "current_batch"}
    assert StreamStatus.from_dict({"batch_id": 6}).to_dict() == {"batch_id": 6}  # an earlier, smaller one
    assert StreamStatus().last_batch() is None and StreamStatus.from_dict({}).to_dict() == {}


def test_status_with_progress_keeps_the_last_batch():
    st = StreamStatus.from_dict({"batch_id": 6, "maintenance": {"at": 1.0}}).with_progress({"batch_id": 7}, 9.0)
    assert st.to_dict() == {"batch_id": 6, "maintenance": {"at": 1.0}, "current_batch": {"batch_id": 7},
                            "updated_at": 9.0}  # fmt: skip


def test_requests_and_handle_round_trip():
    reload = {"reload_id": "x", "run_id": "r", "state": "requested", "requested_at": 1.0}
    assert ReloadRequest.from_dict(reload).to_dict() == reload and ReloadRequest.from_dict(reload).requested
    ready = {**reload, "state": "ready", "ready_at": 2.0}
    assert ReloadRequest.from_dict(ready).to_dict() == ready and not ReloadRequest.from_dict(ready).requested
    stop = {"run_id": None, "requested_at": 3.0, "by": "h"}
    assert StopRequest.from_dict(stop).to_dict() == stop
    assert StopRequest.from_dict({}).requested_at == 0.0
    handle = {"run_id": "r", "mode": "detached", "launcher_pid": 5, "host": "h", "log_path": "/l", "started_at": 1.0,
              "master": "local[2]"}  # fmt: skip
    h = LaunchHandle.from_dict(handle)
    assert h.to_dict() == handle and h.extra == {"master": "local[2]"} and h.log_path == "/l"


def test_schema_change_round_trip():
    d = {"batch_id": 4, "at": 1.0, "changes": [
        {"table": "db.t", "kind": "alter", "sql": "ALTER TABLE t ADD c INT", "offset": {"file": "b.1", "pos": 7}}]}
    rec = SchemaChange.from_dict(d)
    assert rec.to_dict() == d
    assert rec.changes == [PendingDdl("db.t", "alter", "ALTER TABLE t ADD c INT", BinlogOffset("b.1", 7))]
