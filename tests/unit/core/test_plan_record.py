"""The plan record and plan pointer: exact JSON shapes, records of earlier versions, unknown keys kept."""

from __future__ import annotations

from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.plan_record import OffsetStart, PlanPointer, PlanRecord

FULL = {
    "tables": {"db.t": {"table": "db.t", "columns": []}},
    "groups": [{"group_id": 0, "splits": []}, {"group_id": 3, "splits": []}],
    "collations": {"utf8mb4_bin": {"name": "utf8mb4_bin"}},
    "methods": {"db.t": "arithmetic"},
    "pipeline": {"pipeline_id": "p", "sink_root": "/lake", "startup_mode": "initial"},
    "plan_id": "20260101T000000-manual-abcdef",
    "created_at": 1.5,
    "snapshot_tables": ["db.t"],
    "resnapshot_tables": [],
    "takeover_tables": ["db.t"],
    "airflow_run_id": "manual__x",
    "deferred_commit_tables": ["db.t"],
    "offset_tables": {
        "db.u": {
            "offset": {"file": "mysql-bin.000002", "pos": 4},
            "schema": {"table": "db.u"},
            "key_columns": [{"name": "id", "kind": "int", "collation": None}],
            "collations": {},
        }
    },
    "skip_backfill": True,
    "finalized": False,
}


def test_plan_record_round_trip_keeps_every_key():
    assert PlanRecord.from_dict(FULL).to_dict() == FULL
    finalized = {**FULL, "finalized": True, "finalize_outcome": {"plan_id": "x", "added": []}, "future_key": 7}
    assert PlanRecord.from_dict(finalized).to_dict() == finalized


def test_plan_record_views():
    rec = PlanRecord.from_dict(FULL)
    assert rec.sink_root == "/lake" and rec.startup_mode == "initial" and rec.skip_backfill
    assert rec.group_ids == [0, 3]
    assert rec.offset_tables["db.u"] == OffsetStart(
        BinlogOffset("mysql-bin.000002", 4), {"table": "db.u"}, [{"name": "id", "kind": "int", "collation": None}]
    )
    assert rec.snapshot_plan() == {k: FULL[k] for k in ("tables", "groups", "collations", "methods")}


def test_plan_record_of_an_earlier_version_or_a_bare_snapshot_plan_reads_with_defaults():
    rec = PlanRecord.from_dict({"tables": {}, "groups": [], "skip_backfill": False})
    assert rec.pipeline == {} and rec.sink_root is None and rec.startup_mode == "initial"
    assert rec.offset_tables == {} and rec.deferred_commit_tables == [] and rec.takeover_tables == []
    assert not rec.finalized and rec.finalize_outcome is None and rec.plan_id is None
    assert "finalize_outcome" not in rec.to_dict()


def test_plan_pointer_round_trip_and_defaults():
    d = {"plan_id": "p1", "tables": ["db.t"], "finalized": True, "at": 2.0, "airflow_run_id": "manual__x"}
    assert PlanPointer.from_dict(d).to_dict() == d
    assert PlanPointer.from_dict({**d, "other": 1}).to_dict() == {**d, "other": 1}
    old = PlanPointer.from_dict({"plan_id": "p1", "tables": ["db.t"], "finalized": False})
    assert old.airflow_run_id is None and old.at is None and not old.finalized


def test_plan_record_server_id_budget_from_its_pipeline_config_or_the_defaults():
    rec = PlanRecord.from_dict({"pipeline": {"stream_readers": 6, "max_parallel_groups": 4}})
    assert (rec.stream_readers, rec.max_parallel_groups) == (6, 4)
    assert (PlanRecord().stream_readers, PlanRecord().max_parallel_groups) == (8, 16)  # an earlier version's record
