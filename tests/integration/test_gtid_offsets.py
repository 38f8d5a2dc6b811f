"""Offsets carry their server and GTID set, and a GTID set finds its position again (issue 34).

On one server, every recorded offset is found again from its GTID set alone (what a failover does
on the new primary, here checked where the answer is known), across binlog rotations; the set
behind a capped batch end is the start's set plus the transactions in between. Offsets that cannot
be placed — no GTID set, or transactions this server never executed — are refused naming the fix,
and a stream offset written by another server is never read by file:pos. The failover itself, on
a promoted replica, is ``tests/integration/test_failover.py``.
"""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.gtid import GtidSet
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, FinishedChunk, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.failover import FailoverError, follow_failover
from airflow_provider_mysqlcdc.mysql.gtid_positions import GtidPositionError, gtid_set_at, position_of, positions_of
from airflow_provider_mysqlcdc.mysql.server import current_offset, server_identity, server_info
from airflow_provider_mysqlcdc.plan_rules import PipelineStateError, resolved_start
from airflow_provider_mysqlcdc.state import StateStore

pytestmark = pytest.mark.integration


@pytest.fixture(params=["mariadb1011", "mysql97"])
def gtid_server(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return request.getfixturevalue("mariadb" if request.param == "mariadb1011" else request.param)


def _write(server, db: str, n: int) -> None:  # type: ignore[no-untyped-def]
    with server.root_connection(db) as conn, conn.cursor() as cur:
        for i in range(n):
            cur.execute("INSERT INTO t (v) VALUES (%s)", (i,))


def test_every_offset_is_found_again_from_its_gtid_set(gtid_server) -> None:  # type: ignore[no-untyped-def]
    db = "gtid_" + uuid.uuid4().hex[:8]
    gtid_server.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
    try:
        with gtid_server.cdc_settings().connect() as conn:
            info = server_info(conn)
            here = server_identity(conn, info)
            marks = []
            for round_ in range(3):
                _write(gtid_server, db, 5 + round_)
                marks.append(current_offset(conn, info))
                if round_ == 1:
                    gtid_server.flush_binary_logs()
            assert all(m.server == here and m.gtid_set for m in marks), marks
            targets = [GtidSet.parse(m.gtid_set, info.is_mariadb) for m in marks]
            found = positions_of(conn, targets, here, info)
            for mark, at in zip(marks[:2], found[:2], strict=True):
                # a mark is a commit's end: the next transaction starts there, or the next file does
                assert at.position() == mark.position() or (at.file_number > mark.file_number and at.pos < 1024), (
                    mark, at)  # fmt: skip
            assert found[2].position() == marks[2].position()  # the head: nothing after it yet
            assert position_of(conn, targets[0], here, info).position() == found[0].position()
            # the set behind a batch end, from the start's set and the transactions in between
            assert GtidSet.parse(gtid_set_at(conn, marks[0], marks[2], info)) == targets[2]
            assert gtid_set_at(conn, marks[0].position(), marks[2], info) is None  # no set to start from
    finally:
        gtid_server.execute(f"DROP DATABASE IF EXISTS {db}")


def _manifest(offset: BinlogOffset) -> Manifest:
    column = {"name": "id", "ordinal": 1, "data_type": "int", "column_type": "int", "nullable": False}
    schema = TableSchema.from_dict({"table": "db.t", "columns": [column], "primary_key": ["id"]})
    chunk = SnapshotChunk("db.t", 0, (), None, None)
    return Manifest.of({"db.t": CapturedTable(schema, ["id"], [FinishedChunk(chunk, offset)])})


def test_offsets_another_server_wrote_are_translated_or_refused_never_read_by_position(gtid_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with gtid_server.cdc_settings().connect() as conn:
        info = server_info(conn)
        head = current_offset(conn, info)
        store = StateStore(str(tmp_path / "state"), "p")
        # written by this server: left as it is
        store.write_manifest(_manifest(head))
        assert follow_failover(conn, store).generation.number == 0  # type: ignore[union-attr]

        # another server's offset with the same file name and position but no GTID set: refused
        store.write_manifest(_manifest(BinlogOffset(head.file, head.pos, None, "mariadb:424242")))
        with pytest.raises(FailoverError, match=r"without a GTID set.*recover_purged"):
            follow_failover(conn, store)

        # another server's offset whose GTID set holds a transaction this server never executed
        if info.is_mariadb:
            domain, server_id, seq = str(head.gtid_set).split(",")[0].split("-")
            ahead = f"{domain}-{server_id}-{int(seq) + 1000}"
        else:
            ahead = f"{head.gtid_set},aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee:1-3"
        store.write_manifest(_manifest(BinlogOffset("mysql-bin.000001", 4, ahead, "mariadb:424242")))
        with pytest.raises(FailoverError, match="has not executed every transaction"):
            follow_failover(conn, store)
        with pytest.raises(GtidPositionError):
            position_of(conn, GtidSet.parse(ahead, info.is_mariadb), "x", info)

        # another server's offset with a GTID set this server holds: a new generation from its position here
        stale = BinlogOffset("mysql-bin.000001", 4, head.gtid_set, "mariadb:424242")
        store.write_manifest(_manifest(stale))
        rebased = follow_failover(conn, store)
        assert rebased is not None and rebased.generation.number == 1
        assert rebased.start_offset.server == server_identity(conn, info)
        assert rebased.start_offset.position() == head.position() or rebased.start_offset > head
        assert store.read_manifest().start_offset == rebased.start_offset  # type: ignore[union-attr]


def test_specific_offset_by_gtid_set_starts_after_those_transactions(gtid_server) -> None:  # type: ignore[no-untyped-def]
    """Item 6: ``specific_offset`` as a GTID set (Flink CDC's ``specific-offset.gtid-set``) is placed
    on the server the plan reaches; a set the server never executed is refused naming the set."""
    db = "gtids_" + uuid.uuid4().hex[:8]
    gtid_server.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
    try:
        with gtid_server.cdc_settings().connect() as conn:
            _write(gtid_server, db, 3)
            mark = current_offset(conn)
            _write(gtid_server, db, 3)
            base = {"pipeline_id": "p", "sink_root": "/l", "state_root": "/s", "tables": [f"{db}.t"],
                    "startup_mode": "specific-offset"}  # fmt: skip
            config = PipelineConfig.from_params(**base, specific_offset={"gtid_set": mark.gtid_set})
            start = resolved_start(conn, config, None, 0)
            assert start.position() == mark.position() and start.gtid_set == mark.gtid_set
            # the transactions after the mark are the ones a stream from there reads
            assert gtid_set_at(conn, start, current_offset(conn)) == current_offset(conn).gtid_set
            unknown = "7-9-99" if server_info(conn).is_mariadb else "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee:1-3"
            config = PipelineConfig.from_params(**base, specific_offset=unknown)
            with pytest.raises(PipelineStateError, match="has not executed every transaction"):
                resolved_start(conn, config, None, 0)
    finally:
        gtid_server.execute(f"DROP DATABASE IF EXISTS {db}")
