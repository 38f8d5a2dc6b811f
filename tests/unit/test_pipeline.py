"""Pure parts of the pipeline steps: manifest merge, offset-only entries, stream state and control."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, Manifest
from airflow_provider_mysqlcdc.core.manifest_build import offset_table
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema
from airflow_provider_mysqlcdc.pipeline import new_plan_id
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import (
    RUN,
    STOP_REQUEST,
    StreamRunRecorder,
    checkpoint_offset,
    pipeline_status,
    request_stop,
    stream_state,
    watch_condition,
)


def _schema(name: str = "shop.t") -> TableSchema:
    cols = [ColumnInfo("id", 1, "bigint", "bigint(20)", False), ColumnInfo("v", 2, "int", "int(11)", True)]
    return TableSchema(TableId.parse(name), cols, ["id"])


def _entry(name: str, hws: list[tuple[str, int]]) -> CapturedTable:
    return offset_table(_schema(name), [{"name": "id", "kind": "int", "collation": None}], BinlogOffset(*hws[0]))


def _collation(name: str) -> Collation:
    return Collation(name, "binary", pad_space=False)


def test_offset_entry_is_one_unbounded_chunk_that_passes_from_its_offset() -> None:
    m = Manifest.of({"shop.t": _entry("shop.t", [("b.000002", 400)])})
    assert m.start_offset == BinlogOffset("b.000002", 400)
    f = Manifest.from_json(m.to_json()).handoff_filter()
    assert not f.emits("shop.t", (5,), BinlogOffset("b.000002", 399))
    assert f.emits("shop.t", (5,), BinlogOffset("b.000002", 400))
    assert f.emits("shop.t", (-(2**62),), BinlogOffset("b.000003", 4))
    assert not f.emits("shop.other", (5,), BinlogOffset("b.000003", 4))
    # the chunk key is the column's name (what the stream's tasks look up in a row image) and kind
    assert m.tables["shop.t"].chunk_key_columns == ["id"]
    assert m.to_dict()["tables"]["shop.t"]["splits"][0]["key_types"] == ["int"]


def test_merge_keeps_old_tables_replaces_given_ones_and_takes_the_min_hw() -> None:
    old = Manifest.of({"shop.a": _entry("shop.a", [("b.000003", 100)])}, {"x": _collation("x")})
    new = old.merged({"shop.b": _entry("shop.b", [("b.000002", 900)])}, {"y": _collation("y")})
    assert set(new.tables) == {"shop.a", "shop.b"}
    assert new.start_offset == BinlogOffset("b.000002", 900)
    assert set(new.collations) == {"x", "y"}
    again = new.merged({"shop.a": _entry("shop.a", [("b.000004", 4)])}, {})
    assert again.tables["shop.a"].chunks[0].high_watermark == BinlogOffset("b.000004", 4)
    assert again.tables["shop.b"] == new.tables["shop.b"]
    assert Manifest.from_json(again.to_json()).to_dict() == again.to_dict()


def test_plan_ids_are_safe_and_unique() -> None:
    a, b = new_plan_id("manual__2026-11-22T06:27:32.218974+00:00"), new_plan_id(None)
    assert a != b and "manual" in a and "/" not in a and ":" not in a
    StateStore("/tmp", "p").write_plan  # noqa: B018 - the id must be usable as a path part
    assert all(c.isalnum() or c in "_.-T" for c in a)


def test_checkpoint_offset_reads_the_last_committed_batch(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    assert checkpoint_offset(store) is None
    base = tmp_path / "p" / "checkpoint"
    (base / "offsets").mkdir(parents=True)
    (base / "commits").mkdir()
    for n, pos in ((0, 100), (1, 200), (2, 300)):
        (base / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"file":"b.000001","pos":{pos}}}\n')
    for n in (0, 1):  # batch 2 was planned but not committed (a crash mid-batch)
        (base / "commits" / str(n)).write_text("v1\n{}\n")
    assert checkpoint_offset(store) == BinlogOffset("b.000001", 200)


def test_stream_state_and_watch_condition(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    st = stream_state(store)
    assert st["running"] is False and st["state"] is None
    assert watch_condition(st, None, None)[1] is not None  # not running -> an error, never "done"

    rec = StreamRunRecorder(store, "r1")
    rec.write(state="running", committed_offset={"file": "b.000001", "pos": 50})
    st = stream_state(store)
    assert st["running"] and st["pid"] == os.getpid()
    assert watch_condition(st, BinlogOffset("b.000001", 60), None) == (False, None)
    assert watch_condition(st, BinlogOffset("b.000001", 50), None) == (True, None)
    store.write_json("stream/status.json", {"lag_seconds": 9.0})
    assert watch_condition(stream_state(store), None, 5.0) == (False, None)
    assert watch_condition(stream_state(store), None, 10.0) == (True, None)

    # a heartbeat older than the staleness limit means the driver died without saying so...
    run = store.read_json(RUN)
    run["heartbeat_at"] = time.time() - 3600
    store.write_json(RUN, run)
    st = stream_state(store)
    assert st["running"] and st["heartbeat_age_seconds"] > 3000  # ...unless its process lives on this host
    store.write_json(RUN, {**run, "host": "another-host"})
    st = stream_state(store)
    assert st["running"] is False and st["state"] == "lost" and "sent no heartbeat for 3600s" in st["reason"]
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.write_json(RUN, {**run, "pid": dead.pid})
    st = stream_state(store)
    assert st["running"] is False and st["state"] == "lost"
    assert f"process {dead.pid} on this host is gone" in st["reason"]


def test_a_driver_on_this_host_is_as_alive_as_its_own_process(tmp_path: Path) -> None:
    """The pid check knows the process, not just the number: a later process given the same pid, or
    a container that only shares the host name, is not the driver."""
    store = StateStore(str(tmp_path), "p")
    rec = StreamRunRecorder(store, "r1")
    rec.write(state="running")
    run = store.read_json(RUN)
    assert run["pid_start"] and run["pid_space"]  # recorded by the driver
    assert stream_state(store)["running"]
    store.write_json(RUN, {**run, "pid_start": run["pid_start"] - 1})  # another process with this pid
    st = stream_state(store)
    assert st["state"] == "lost" and f"driver process {os.getpid()} on this host is gone" in st["reason"]
    elsewhere = {**run, "pid_space": "another-boot/pid:[1]", "heartbeat_at": time.time() - 3600}
    store.write_json(RUN, elsewhere)  # same host name, another machine or pid namespace: the heartbeat rule
    st = stream_state(store)
    assert st["state"] == "lost" and "sent no heartbeat for 3600s" in st["reason"]
    store.write_json(RUN, {**elsewhere, "heartbeat_at": time.time()})
    assert stream_state(store)["running"]


def test_a_stream_that_is_not_running_has_no_lag(tmp_path: Path) -> None:
    """The last batch's lag says nothing about a lake that no longer moves: null, with the age of the
    last batch instead, and what to do."""
    store = StateStore(str(tmp_path), "p")
    rec = StreamRunRecorder(store, "r1")
    rec.write(state="running", committed_offset={"file": "b.000001", "pos": 50})
    store.write_json("stream/status.json", {"batch_id": 3, "lag_seconds": 1.25, "updated_at": time.time() - 90})
    st = stream_state(store)
    assert st["lag_seconds"] == 1.25 and 89 <= st["last_batch_age_seconds"] <= 95
    status = pipeline_status(store, BinlogOffset("b.000001", 900))
    assert status["lag_seconds"] == 1.25 and status["stream_fix"] is None
    rec.write(state="stopped")
    st = stream_state(store)
    assert st["lag_seconds"] is None and st["last_batch_age_seconds"] >= 89
    status = pipeline_status(store, BinlogOffset("b.000001", 900))
    assert status["behind_server"] is True and status["lag_seconds"] is None
    assert status["stream_state"] == "stopped" and "re-run the DAG" in status["stream_fix"]
    assert pipeline_status(store, BinlogOffset("b.000001", 50))["lag_seconds"] == 0.0  # stopped, nothing to apply
    rec.write(state="failed", error="binlog purged")
    assert pipeline_status(store)["stream_fix"].startswith("fix what stream_reason says, then re-run the DAG")


def test_stop_request_is_seen_only_by_its_run(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    rec = StreamRunRecorder(store, "r1")
    rec.write(state="running")
    assert not rec.stop_requested()
    store.write_json(STOP_REQUEST, {"run_id": "other", "requested_at": time.time()})
    assert not rec.stop_requested()
    store.write_json(STOP_REQUEST, {"run_id": "r1", "requested_at": time.time()})
    assert rec.stop_requested()
    store.write_json(STOP_REQUEST, {"run_id": "r1", "requested_at": time.time() - 3600})  # a stale request
    assert not rec.stop_requested()


def test_request_stop_of_a_stream_that_is_not_running(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    store.write_json(STOP_REQUEST, {"run_id": None, "requested_at": time.time()})
    out = request_stop(store, timeout=1)
    assert out["stopped"] is False
    assert not store.exists(STOP_REQUEST)  # no stale request left to stop the next stream


@pytest.mark.parametrize("state", ["stopped", "failed"])
def test_finished_runs_are_not_running(tmp_path: Path, state: str) -> None:
    store = StateStore(str(tmp_path), "p")
    StreamRunRecorder(store, "r1").write(state=state, error="boom" if state == "failed" else None)
    st = stream_state(store)
    assert st["running"] is False and st["state"] == state
    done, error = watch_condition(st, None, None)
    assert not done and state in error and json.dumps(st)


def test_finalize_is_not_repeated_over_a_manifest_that_moved_on(tmp_path: Path) -> None:
    """A retried stream task must not roll back what the stream recorded since (e.g. a followed ALTER)."""
    from airflow_provider_mysqlcdc.pipeline import finalize_run
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink

    store, sink = StateStore(str(tmp_path / "state"), "p"), DeltaSink(str(tmp_path / "lake"))
    store.write_plan("p1", {
        "tables": {}, "groups": [], "collations": {},
        "offset_tables": {"shop.t": {
            "offset": {"file": "b.000001", "pos": 4}, "schema": _schema().to_dict(),
            "key_columns": [{"name": "id", "kind": "int", "collation": None}], "collations": {},
        }},
    })
    first = finalize_run(store, sink, "p1")
    assert first.added == ["shop.t"] and sink.exists("shop.t")
    manifest = store.read_json("manifest.json")
    manifest["tables"]["shop.t"]["schema_position"] = {"file": "b.000002", "pos": 99}
    store.write_json("manifest.json", manifest)
    again = finalize_run(store, sink, "p1")
    assert again == first
    assert store.read_json("manifest.json")["tables"]["shop.t"]["schema_position"] == {"file": "b.000002", "pos": 99}


def test_plan_refuses_a_server_id_range_too_small_before_touching_the_source(tmp_path: Path) -> None:
    from airflow_provider_mysqlcdc.core.config import PipelineConfig
    from airflow_provider_mysqlcdc.pipeline import PipelineStateError, plan_run

    config = PipelineConfig.from_params(pipeline_id="p", sink_root=str(tmp_path / "lake"),
                                        state_root=str(tmp_path / "state"), tables=["shop.orders"],
                                        stream_readers=6, max_parallel_groups=4)  # fmt: skip
    store = StateStore(config.state_root, "p")
    with pytest.raises(PipelineStateError, match=r"has 6 ids; this pipeline needs 6 \(stream readers\) \+ 4 .* = 10"):
        plan_run(None, store, config, "p1", lambda t: False, server_id_range=(5400, 5405))
    assert store.read_plan_pointer() is None


def test_a_repair_replaces_chunks_and_a_late_hand_over_keeps_only_their_new_hws() -> None:
    from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
    from airflow_provider_mysqlcdc.core.keys import KeyColumn
    from airflow_provider_mysqlcdc.core.manifest import FinishedChunk, ManifestError

    col = (KeyColumn("id", "int"),)
    bounds = [None, 10, 20, None]
    chunks = [SnapshotChunk("shop.t", i, col, None if a is None else (a,), None if b is None else (b,))
              for i, (a, b) in enumerate(itertools.pairwise(bounds))]  # fmt: skip
    hw = BinlogOffset("b.000002", 100)
    table = CapturedTable(_schema(), ["id"], [FinishedChunk(c, hw) for c in chunks])
    other = _entry("shop.o", [("b.000002", 50)])
    m = Manifest.of({"shop.t": table, "shop.o": other})
    repaired = FinishedChunk(chunks[1], BinlogOffset("b.000002", 300))
    m2 = m.with_chunks("shop.t", [repaired])
    assert [c.high_watermark.pos for c in m2.tables["shop.t"].chunks] == [100, 300, 100]
    with pytest.raises(ManifestError, match=r"has no chunks \[7\]"):
        m.with_chunks("shop.t", [FinishedChunk(SnapshotChunk("shop.t", 7, col, (30,), None), hw)])
    # the stream had applied up to P = 200: the other chunks need nothing before P again; the
    # repaired one (HW 300 here) keeps its HW
    p = BinlogOffset("b.000002", 200)
    h = m2.handed_over("pipe", p, [], {"shop.t": [1]})
    assert [c.high_watermark.pos for c in h.tables["shop.t"].chunks] == [200, 300, 200]
    assert h.tables["shop.o"].chunks[0].high_watermark == p
    assert h.start_offset == p and h.generation.number == m2.generation.number + 1


def test_a_partial_backfill_s_chunks_resume_where_the_lake_s_other_rows_stand() -> None:
    from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
    from airflow_provider_mysqlcdc.core.keys import KeyColumn
    from airflow_provider_mysqlcdc.core.manifest import FinishedChunk
    from airflow_provider_mysqlcdc.core.manifest_build import partial_backfill_chunks

    col = (KeyColumn("id", "int"),)
    chunks = [SnapshotChunk("shop.t", 0, col, None, (10,)), SnapshotChunk("shop.t", 1, col, (10,), None)]
    old = [FinishedChunk(c, BinlogOffset("b.000002", pos)) for c, pos in zip(chunks, (100, 40), strict=True)]
    fresh = [FinishedChunk(c, BinlogOffset("b.000002", 300)) for c in chunks]
    # the stream's checkpoint P = 200 is before the new HW: the rows the filter left out are as of P
    assert [c.high_watermark.pos for c in partial_backfill_chunks(fresh, old, BinlogOffset("b.000002", 200))] == [
        200, 200]  # fmt: skip
    # P after the new HW: the new HW, as a repair gives
    assert [c.high_watermark.pos for c in partial_backfill_chunks(fresh, old, BinlogOffset("b.000003", 4))] == [
        300, 300]  # fmt: skip
    # no batch ran yet: each chunk's other rows are as of its old HW
    assert [c.high_watermark.pos for c in partial_backfill_chunks(fresh, old, None)] == [100, 40]


def test_finalize_records_the_changelog_and_metadata_options_in_the_manifest(tmp_path: Path) -> None:
    """metadata_columns shapes a new table's Delta table; changelog_tables may be switched on later."""
    from deltalake import DeltaTable

    from airflow_provider_mysqlcdc.pipeline import finalize_run
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink

    store, sink = StateStore(str(tmp_path / "state"), "p"), DeltaSink(str(tmp_path / "lake"))
    offset_start = {"offset": {"file": "b.000001", "pos": 4}, "schema": _schema().to_dict(),
                    "key_columns": [{"name": "id", "kind": "int", "collation": None}], "collations": {}}  # fmt: skip
    store.write_plan("p1", {"tables": {}, "groups": [], "collations": {}, "offset_tables": {"shop.t": offset_start},
                            "pipeline": {"metadata_columns": True}})  # fmt: skip
    finalize_run(store, sink, "p1")
    entry = store.read_manifest().tables["shop.t"]
    assert entry.metadata_columns and not entry.changelog
    names = [f.name for f in DeltaTable(sink.table_uri("shop.t")).schema().fields]
    assert names == ["id", "v", "_op", "_commit_ts", "_binlog_file", "_binlog_pos"]
    store.write_plan("p2", {"tables": {}, "groups": [], "collations": {},
                            "pipeline": {"metadata_columns": True, "changelog_tables": ["shop.*"]}})  # fmt: skip
    finalize_run(store, sink, "p2")
    entry = store.read_manifest().tables["shop.t"]
    assert entry.changelog and entry.metadata_columns


def test_a_changelog_complete_to_an_offset_is_recorded_and_never_moves_back() -> None:
    m = Manifest.of({"shop.a": _entry("shop.a", [("b.000002", 100)]), "shop.b": _entry("shop.b", [("b.000002", 90)])})
    p = BinlogOffset("b.000002", 500)
    m2 = m.with_changelog_from(["shop.a"], p)
    assert m2.tables["shop.a"].changelog_from == p and m2.tables["shop.b"].changelog_from is None
    assert Manifest.from_json(m2.to_json()).tables["shop.a"].changelog_from == p
    assert "changelog_from" not in m.to_dict()["tables"]["shop.a"]  # manifests without it read as before
    assert m2.with_changelog_from(["shop.a"], BinlogOffset("b.000002", 300)).tables["shop.a"].changelog_from == p
    later = BinlogOffset("b.000003", 4)
    assert m2.with_changelog_from(["shop.a"], later).tables["shop.a"].changelog_from == later


def test_a_reread_chunk_of_a_logged_table_takes_its_changes_from_the_earlier_of_its_hw_and_the_pause() -> None:
    from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
    from airflow_provider_mysqlcdc.core.keys import KeyColumn
    from airflow_provider_mysqlcdc.core.manifest import FinishedChunk
    from airflow_provider_mysqlcdc.handover_changelog import logged_chunks

    col = (KeyColumn("id", "int"),)
    chunks = [FinishedChunk(SnapshotChunk("shop.t", 0, col, None, (10,)), BinlogOffset("b.000002", 300)),
              FinishedChunk(SnapshotChunk("shop.t", 1, col, (10,), None), BinlogOffset("b.000002", 100))]  # fmt: skip
    # a stream paused at 200, before the first chunk's HW: its changes from 200 on must reach the changelog
    assert [c.high_watermark.pos for c in logged_chunks(chunks, BinlogOffset("b.000002", 200))] == [200, 100]
