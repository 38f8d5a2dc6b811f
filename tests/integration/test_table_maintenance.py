"""Table maintenance keeps a streamed table's disk use near its live data, under a reader.

Hundreds of micro-batches of small transactions on a real MariaDB table, applied by the stream's
own ``BatchApplier`` with maintenance every few seconds and a retention of seconds (hours in
production: the point is the mechanics). A reader reads the latest version throughout: it never
fails and every version it sees holds exactly the rows of its batch. At the end disk use is within
3x the live data, the stream's batch ids survived compaction, checkpoints and log cleanup (a
replayed batch is skipped), and the sink equals the source. ``bench/soak.py`` runs 2,000 batches.
"""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy
from tests.support.soak import run_soak

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.mark.timeout(900)
def test_soak_with_maintenance_stays_small_and_exact(private_server, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    policy = MaintenancePolicy(interval_seconds=3.0, retention_hours=2 / 3600, log_retention_hours=4 / 3600,
                               small_file_mb=4, min_small_files=4)  # fmt: skip
    out = run_soak(private_server, spark, tmp_path, batches=300, rows=20_000, policy=policy)
    assert out["sink_matches_source"], out["first_difference"]
    assert out["maintenance_rounds"] >= 3, out
    assert out["reader_errors"] == [] and out["reader_inconsistent"] == [], out
    assert out["reader_versions"] >= 20, out  # the reader really read along
    assert out["replay_skipped"], out
    assert out["disk_factor"] <= 3.0, out


class _Clock:
    """Each reading is one second after the last: a pause's budget counts tables, not real time."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_a_round_over_many_tables_is_spread_over_the_pauses_between_batches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A round every interval, each pause maintaining tables until its budget is spent (at least one),
    so a stream of hundreds of tables is never held up for the whole round; ``force`` does it all."""
    import pyarrow as pa

    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.stream.maintenance_rounds import MaintenanceRounds

    sink = DeltaSink(str(tmp_path / "lake"), owner="p")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    tables = [f"db.t{i}" for i in range(5)]
    for t in tables:
        sink.prepare_table(t, schema, ["id"])
        sink.apply_changes(t, pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=schema),
                           pa.table({"id": pa.array([], pa.int64())}), ["id"], "app", 1)  # fmt: skip
    clock = _Clock()
    rounds = MaintenanceRounds(sink, MaintenancePolicy(interval_seconds=50), budget_seconds=2.5, clock=clock)
    assert rounds.step(tables, lambda: True) is None and not rounds.done  # the interval has not passed
    clock.t += 100
    shares = []
    summary = None
    while summary is None:
        summary = rounds.step(tables, lambda: True)
        shares.append(len(rounds.done) - sum(shares))
    assert shares == [2, 2, 1]  # two tables per pause within its budget, the last pause ends the round
    assert sorted(summary["tables"]) == tables
    assert all(r["checkpoint_version"] is not None for r in summary["tables"].values()), summary
    assert rounds.step(tables, lambda: True) is None  # the next round waits for the interval
    forced = rounds.step(tables, lambda: True, force=True)
    assert forced is not None and sorted(forced["tables"]) == tables  # all at once


def test_a_small_table_keeps_the_small_table_retention_and_its_leftovers_are_vacuumed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A stream that stopped leaves the files its last batches superseded within their grace, which
    the next stream does not know of: a maintenance round deletes those older than the small-table
    retention (exactly, like the stream would have) and gives the table that retention for its log
    and files — and leaves a bigger table the vacuum retention."""
    import time
    from pathlib import Path

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.sinks.delta_maintenance import maintain_table

    root = str(tmp_path / "lake")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    stopped = DeltaSink(root, owner="p", rewrite_below_bytes=64_000, small_table_retention_seconds=1)
    for t, rows in (("db.small", 200), ("db.big", 20_000)):
        stopped.prepare_table(t, schema, ["id"])
        write_deltalake(stopped.open(t), pa.table({"id": list(range(rows)), "v": [f"{i:08x}" * 4 for i in range(rows)]},
                                                  schema=schema), mode="append")  # fmt: skip
    for version in range(1, 4):  # each batch rewrites the small table whole, superseding its file
        stopped.apply_changes("db.small", pa.table({"id": [version], "v": ["x"]}, schema=schema),
                              pa.table({"id": pa.array([], pa.int64())}), ["id"], "app", version)  # fmt: skip
    small_dir = Path(stopped.table_uri("db.small"))
    on_disk = {str(p.relative_to(small_dir)) for p in small_dir.rglob("*.parquet") if "_delta_log" not in p.parts}
    live = set(stopped.table_files("db.small"))
    assert len(on_disk - live) == 3  # the snapshot's file and two rewrites, within their grace

    restarted = DeltaSink(root, owner="p", rewrite_below_bytes=64_000, small_table_retention_seconds=1)
    time.sleep(1.5)  # the grace passes
    policy = MaintenancePolicy()
    small = maintain_table(restarted, "db.small", policy, orphans=True)
    assert small.small and small.vacuumed_files == 3
    on_disk = {str(p.relative_to(small_dir)) for p in small_dir.rglob("*.parquet") if "_delta_log" not in p.parts}
    assert on_disk == live
    conf = DeltaTable(stopped.table_uri("db.small")).metadata().configuration
    assert conf["delta.logRetentionDuration"] == conf["delta.deletedFileRetentionDuration"] == "interval 1 seconds"
    assert {r["id"]: r["v"] for r in restarted.read("db.small").to_pylist()}[3] == "x"

    big = maintain_table(restarted, "db.big", policy, orphans=True)
    assert not big.small
    conf = DeltaTable(stopped.table_uri("db.big")).metadata().configuration
    assert conf["delta.deletedFileRetentionDuration"] == "interval 3600 seconds"
    assert conf["delta.logRetentionDuration"] == "interval 86400 seconds"
