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
