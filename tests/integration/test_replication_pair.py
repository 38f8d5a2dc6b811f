"""The primary + GTID replica pair that failover tests stand on (``tests/support/replication.py``).

Proves, on MariaDB 10.11, MariaDB 11.8 and MySQL 9.7, what those tests will assume: the replica applies the
primary's writes and logs them under the primary's GTIDs, at binlog coordinates of its own (a
primary's ``file:pos`` names something else on the replica); after the primary is killed and the
replica promoted, the new primary takes writes and its GTID state holds the old primary's
transactions followed by its own. One pair per flavour, shared by the module's tests in order
(the last one consumes it).
"""

from __future__ import annotations

import time

import pymysql
import pytest

from tests.support.mariadb import MariaDBServer
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.replication import (
    ReplicaPair,
    binlog_gtids,
    current_coordinates,
    gtid_state,
    parse_mariadb_gtid_pos,
)

pytestmark = pytest.mark.integration

PAIR_FIXTURES = {"mariadb1011": "mariadb_pair", "mariadb118": "mariadb118_pair", "mysql97": "mysql_pair"}
DB = "repl"


@pytest.fixture(scope="module", params=sorted(PAIR_FIXTURES))
def pair(request: pytest.FixtureRequest) -> ReplicaPair:
    return request.getfixturevalue(PAIR_FIXTURES[request.param])  # type: ignore[no-any-return]


def _rows(server: MariaDBServer) -> list[tuple[int, str]]:
    return [(int(i), str(v)) for i, v in server.query(f"SELECT id, v FROM `{DB}`.t ORDER BY id")]


def _write(server: MariaDBServer, ids: range) -> None:
    """One transaction per row: one GTID each."""
    for i in ids:
        server.execute(f"INSERT INTO `{DB}`.t VALUES ({i}, 'v{i}')")


def _checksums(server: MariaDBServer, tables: list[str]) -> dict[str, int]:
    return {str(name): int(value) for name, value in server.query(f"CHECKSUM TABLE {', '.join(tables)}")}


def _random_writes(server: MariaDBServer, db: str, seconds: float) -> None:
    writer = RandomWriter(server, db, rate=200.0, rows=300)
    writer.start()
    time.sleep(seconds)
    writer.stop_event.set()
    writer.join(timeout=10)
    assert writer.transactions > 0


def _gtid_at(server: MariaDBServer, file: str, pos: int) -> str | None:
    """The event at ``file:pos`` on ``server`` as (type, info), or None when there is none."""
    try:
        events = server.query(f"SHOW BINLOG EVENTS IN '{file}' FROM {pos} LIMIT 1")
    except pymysql.err.MySQLError:
        return None  # no such file, or no event starts there
    return f"{events[0][2]} {events[0][5]}" if events else None


def test_replica_applies_the_primarys_writes(pair: ReplicaPair) -> None:
    assert pair.replica.query("SELECT @@GLOBAL.read_only")[0][0] == 1
    pair.primary.execute(
        f"CREATE DATABASE `{DB}`", f"CREATE TABLE `{DB}`.t (id INT PRIMARY KEY, v VARCHAR(20))"
    )
    _write(pair.primary, range(1, 11))
    pair.wait_caught_up(timeout=20)
    assert _rows(pair.replica) == [(i, f"v{i}") for i in range(1, 11)]
    # The CDC user can read the replica over TCP, as it would after a failover.
    conn = pair.replica.cdc_settings().connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM `{DB}`.t")
            assert cur.fetchone()[0] == 10
    finally:
        conn.close()


def test_replica_binlog_has_the_same_gtids_at_other_coordinates(pair: ReplicaPair) -> None:
    primary_gtids = binlog_gtids(pair.primary)
    assert len(primary_gtids) == 12  # CREATE DATABASE, CREATE TABLE, 10 inserts
    assert binlog_gtids(pair.replica) == primary_gtids
    if pair.is_mariadb:
        assert {g.split("-")[1] for g in primary_gtids} == {"1"}  # the primary's server_id, kept by the replica

    # Same base name, different files: the primary's coordinates mean something else on the replica.
    primary_file, _ = current_coordinates(pair.primary)
    replica_file, _ = current_coordinates(pair.replica)
    assert primary_file == "mysql-bin.000001"
    assert replica_file == "mysql-bin.000003"
    last = [e for e in pair.primary.query(f"SHOW BINLOG EVENTS IN '{primary_file}'") if e[2] == "Gtid"][-1]
    at_primary = _gtid_at(pair.primary, primary_file, int(last[1]))
    assert at_primary is not None and primary_gtids[-1] in at_primary.replace("'", "")
    assert _gtid_at(pair.replica, primary_file, int(last[1])) != at_primary


def test_random_writer_replicates(pair: ReplicaPair) -> None:
    """The random writer's tables and key moves (what failover tests will stream) arrive intact."""
    pair.primary.execute("CREATE DATABASE rw")
    tables = make_tables(pair.primary, "rw", rows=300)
    _random_writes(pair.primary, "rw", 0.5)
    pair.wait_caught_up(timeout=20)
    assert _checksums(pair.replica, tables) == _checksums(pair.primary, tables)


def test_wait_caught_up_reports_a_stopped_replica(pair: ReplicaPair) -> None:
    """A conflicting row on the replica stops its SQL thread: wait_caught_up says why, at once."""
    with pair.replica.root_connection() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")  # no GTID of the replica's own (strict mode)
        cur.execute(f"INSERT INTO `{DB}`.t VALUES (100, 'conflict')")
    pair.primary.execute(f"INSERT INTO `{DB}`.t VALUES (100, 'v100')")
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"replication stopped.*(1062|Duplicate)"):
        pair.wait_caught_up(timeout=20)
    assert time.monotonic() - started < 10
    with pair.replica.root_connection() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"DELETE FROM `{DB}`.t WHERE id = 100")
    pair.replica.execute("START SLAVE SQL_THREAD" if pair.is_mariadb else "START REPLICA SQL_THREAD")
    pair.wait_caught_up(timeout=20)
    pair.primary.execute(f"DELETE FROM `{DB}`.t WHERE id = 100")
    pair.wait_caught_up(timeout=20)


def test_failover_to_the_promoted_replica(pair: ReplicaPair) -> None:
    _write(pair.primary, range(11, 16))
    pair.wait_caught_up(timeout=20)
    old_state = gtid_state(pair.primary)
    old_gtids = binlog_gtids(pair.primary)

    pair.kill_primary()
    with pytest.raises(pymysql.err.OperationalError):
        pair.primary.root_connection().close()
    new = pair.promote_replica()
    assert new is pair.replica
    assert new.query("SELECT @@GLOBAL.read_only")[0][0] == 0
    assert pair.replica_status() == {}

    _write(new, range(16, 19))
    assert _rows(new) == [(i, f"v{i}") for i in range(1, 19)]
    new_gtids = binlog_gtids(new)
    assert new_gtids[: len(old_gtids)] == old_gtids
    if pair.is_mariadb:
        # Same domain, the sequence goes on under the new primary's server_id (strict mode holds).
        (_, _, last_seq) = (int(x) for x in old_gtids[-1].split("-"))
        assert new_gtids[len(old_gtids):] == [f"0-2-{last_seq + k}" for k in (1, 2, 3)]
        assert parse_mariadb_gtid_pos(gtid_state(new)) == {0: (2, last_seq + 3)}
    else:
        uuid = str(new.query("SELECT @@server_uuid")[0][0])
        assert uuid not in old_state  # the two servers have UUIDs of their own
        assert new_gtids[len(old_gtids):] == [f"{uuid}:{k}" for k in (1, 2, 3)]
        assert new.query("SELECT GTID_SUBSET(%s, @@GLOBAL.gtid_executed)", (old_state,))[0][0] == 1
        assert f"{uuid}:1-3" in gtid_state(new)
    # The existing helpers work on the promoted server as on any other.
    _random_writes(new, "rw", 0.3)
