"""A primary fails over to its GTID replica; the stream resumes there exactly (issue 34, item 5).

Each flavour's primary and replica write their binlogs under the same base name, and the replica's
is rotated ahead (``tests/support/replication.py``). So the old primary's checkpoint file:pos
names a real point in a file of the same name on the new primary, just not the right one. Reading
it would lose rows and apply others twice. The tricky-key tables are snapshotted and streamed
under a random writer on the primary. The stream stops: gracefully on one flavour, and on the
other by an abrupt ``query.stop()`` in the middle of a batch, which is logged but not committed,
as after a killed driver. The writer goes on, the replica catches up, and the primary is killed
or shut down. The replica is promoted and a writer runs on it. Then the stream is restarted as
the stream job restarts it (``failover.follow_failover`` first): a new generation from the
checkpoint's GTID set, placed on the new server. Once the stream catches up, every table equals
the new primary row for row.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from airflow_provider_mysqlcdc.failover import follow_failover
from airflow_provider_mysqlcdc.mysql.checks import check_source
from airflow_provider_mysqlcdc.mysql.server import server_identity
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import checkpoint_offset
from airflow_provider_mysqlcdc.stream.job import StreamOptions, start_stream, stop_gracefully
from tests.integration.test_stream_e2e import assert_sink_equals_source
from tests.support.pipeline_runs import snapshot_tables, stream_to_catch_up
from tests.support.random_writer import RandomWriter, make_tables

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROWS = 1_500


def _snapshot(spark: Any, settings: Any, store: StateStore, sink: DeltaSink, tables: list[str]) -> Any:
    """Every table in several chunks and groups, under the writer."""
    plan = snapshot_tables(spark, settings, store, sink, tables, 200, 8)
    assert len(plan.groups) >= 2
    return plan


def _wait_for_a_commit(store: StateStore, query: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while checkpoint_offset(store) is None:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the stream committed no batch"
        time.sleep(0.2)


def _run_writer(server: Any, db: str, seed: int, seconds: float) -> RandomWriter:
    writer = RandomWriter(server, db, rate=120, seed=seed, rows=ROWS)
    writer.start()
    time.sleep(seconds)
    writer.stop_event.set()
    writer.join()
    assert not writer.errors, writer.errors[:3]
    return writer


def test_capture_from_a_replica_equals_the_primary(mariadb_pair, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Item 7: snapshot and stream read from the replica while the application writes to the primary
    (the replica's binlog holds the replicated transactions: log_slave_updates, which check requires)."""
    primary, replica = mariadb_pair.primary, mariadb_pair.replica
    db = "rc_" + uuid.uuid4().hex[:8]
    primary.execute(f"CREATE DATABASE {db}")
    tables = make_tables(primary, db, rows=ROWS)
    mariadb_pair.wait_caught_up()
    settings = replica.cdc_settings()
    with settings.connect() as conn:
        report = check_source(conn, tables)
    assert report.ok, report.summary()
    store = StateStore(str(tmp_path / "state"), "rc")
    sink = DeltaSink(str(tmp_path / "lake"))
    writer = RandomWriter(primary, db, rate=120, seed=5, rows=ROWS)
    writer.start()
    try:
        plan = _snapshot(spark, settings, store, sink, tables)
        stream_to_catch_up(spark, settings, store, sink, StreamOptions(trigger_seconds=0.5, readers=2), [writer], 2,
                           settled=mariadb_pair.wait_caught_up)  # fmt: skip
    finally:
        writer.stop_event.set()
    assert writer.transactions > 100 and not writer.errors, (writer.transactions, writer.errors[:3])
    assert_sink_equals_source(primary.cdc_settings(), plan, sink, tables)


@pytest.mark.parametrize(("pair_fixture", "abrupt"), [("mariadb_pair", True), ("mysql_pair", False)],
                         ids=["mariadb1011-abrupt-killed", "mysql97-graceful-shut-down"])  # fmt: skip
def test_the_stream_resumes_exactly_on_the_promoted_replica(pair_fixture, abrupt, spark, tmp_path, request) -> None:  # type: ignore[no-untyped-def]
    pair = request.getfixturevalue(pair_fixture)
    old = pair.primary
    db = "fo_" + uuid.uuid4().hex[:8]
    old.execute(f"CREATE DATABASE {db}")
    tables = make_tables(old, db, rows=ROWS)
    store = StateStore(str(tmp_path / "state"), "fo")
    sink = DeltaSink(str(tmp_path / "lake"))
    opts = StreamOptions(trigger_seconds=0.5, readers=2)

    writer = RandomWriter(old, db, rate=120, seed=1, rows=ROWS)
    writer.start()
    try:
        plan = _snapshot(spark, old.cdc_settings(), store, sink, tables)
        query = start_stream(spark, old.cdc_settings(), store, sink, opts)
        _wait_for_a_commit(store, query)
        time.sleep(1.5)
        if abrupt:  # in the middle of a batch: its offsets are logged, its commit is not
            query.stop()
        else:
            stop_gracefully(query)
    finally:
        writer.stop_event.set()
        writer.join()
    assert writer.transactions > 100 and not writer.errors, (writer.transactions, writer.errors[:3])
    checkpoint = checkpoint_offset(store)
    assert checkpoint is not None and checkpoint.gtid_set and checkpoint.server
    _run_writer(old, db, seed=2, seconds=2)  # written after the stream stopped: only the replica keeps them

    pair.wait_caught_up()
    pair.kill_primary() if abrupt else pair.stop_primary()
    new = pair.promote_replica()
    after = _run_writer(new, db, seed=3, seconds=2)
    assert after.transactions > 50

    settings = new.cdc_settings()
    with settings.connect() as conn:
        here = server_identity(conn)
        manifest = follow_failover(conn, store)
    assert manifest is not None and manifest.generation.number == 1
    assert here != checkpoint.server and manifest.start_offset.server == here
    assert {o.server for o in manifest.offsets()} == {here}
    assert checkpoint_offset(store) is None  # the new generation's own checkpoint: nothing read from the old one

    writer = RandomWriter(new, db, rate=120, seed=4, rows=ROWS)
    writer.start()
    try:
        stream_to_catch_up(spark, settings, store, sink, opts, [writer], 3)
    finally:
        writer.stop_event.set()
    assert_sink_equals_source(settings, plan, sink, tables)
