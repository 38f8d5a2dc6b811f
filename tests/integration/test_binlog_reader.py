"""BinlogRangeReader against a real MariaDB: positions, range ends, rotation, resume, errors, blocking.

The positions the reader derives are checked against the server's own ``SHOW BINLOG EVENTS``, and
the range semantics against ``SHOW MASTER STATUS`` values taken around commits: a transaction that
starts before ``end`` is read, one that starts at ``end`` is not (docs/architecture.md, "The handoff").
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.change import RowChange
from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_file_number
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader, BinlogReadError
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError, current_offset
from tests.support.mariadb import MariaDBServer
from tests.support.reference_fold import last_change_per_key

pytestmark = pytest.mark.integration

_ids = itertools.count(7000)  # distinct replication server_ids for this module's readers
# A safety net so that a reader that never notices its end fails the test instead of hanging it.
SAFETY_TIMEOUT = 120.0


def read(
    settings: ConnectionSettings, start: BinlogOffset, end: BinlogOffset | None, tables: list[str] | None, **kw: Any
) -> tuple[list[RowChange], BinlogRangeReader]:
    reader = BinlogRangeReader(settings, start, end, tables, next(_ids), **kw)
    with reader:
        changes = list(reader)
    return changes, reader


def summary(changes: list[RowChange]) -> list[tuple[str, str, Any, Any]]:
    """(op, table, before id, after id) per change."""
    return [
        (c.op, c.table.split(".", 1)[1], c.before["id"] if c.before else None, c.after["id"] if c.after else None)
        for c in changes
    ]


def show_binlog_events(mariadb: MariaDBServer, start: BinlogOffset, end: BinlogOffset) -> list[dict[str, Any]]:
    """The server's own list of events from start's file to end's file (root: SHOW BINLOG EVENTS)."""
    files = [f for f, *_ in mariadb.query("SHOW BINARY LOGS")]
    out = []
    for f in files:
        if start.file_number <= binlog_file_number(f) <= end.file_number:
            for row in mariadb.query(f"SHOW BINLOG EVENTS IN '{f}'"):
                out.append({"file": row[0], "pos": row[1], "type": row[2], "end": row[4], "info": row[5]})
    return out


def dump_threads(mariadb: MariaDBServer) -> set[int]:
    return {int(r[0]) for r in mariadb.query("SHOW PROCESSLIST") if r[4] == "Binlog Dump"}


def wait_for_idle_dump(mariadb: MariaDBServer, exclude: set[int]) -> int:
    """Wait until a new binlog dump thread has sent everything and waits for more (our reader idles)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for row in mariadb.query("SHOW PROCESSLIST"):
            if row[4] == "Binlog Dump" and int(row[0]) not in exclude and "waiting" in str(row[6]).lower():
                return int(row[0])
        time.sleep(0.05)
    raise AssertionError("no new binlog dump thread became idle within 60 s")


@contextlib.contextmanager
def background(fn: Callable[[], None]) -> Iterator[None]:
    """Run ``fn`` in a thread for the duration of the block; re-raise its error after."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        t.join(60)
    assert not t.is_alive(), "helper thread did not finish"
    if errors:
        raise errors[0]


# --------------------------------------------------------------------------------------------- basics


def test_inserts_updates_deletes_multirow_and_key_change(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    mariadb.execute(
        f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(20), d DECIMAL(10,2), ts DATETIME(6), j JSON)"
    )
    start = current_offset(cdc_conn)
    t0 = int(mariadb.query("SELECT UNIX_TIMESTAMP()")[0][0])
    mariadb.execute(
        f"INSERT INTO `{db}`.t VALUES (1,'a',1.50,'2026-01-02 03:04:05.123456','{{\"k\": [1, 2]}}'),"
        "(2,'b',NULL,NULL,NULL),(3,'c',3,NULL,NULL)",
        f"UPDATE `{db}`.t SET v = CONCAT(v, '!') WHERE id IN (1, 2)",
        f"UPDATE `{db}`.t SET id = 30 WHERE id = 3",
        f"DELETE FROM `{db}`.t WHERE id IN (1, 30)",
    )
    end = current_offset(cdc_conn)
    t1 = int(mariadb.query("SELECT UNIX_TIMESTAMP()")[0][0])
    changes, reader = read(cdc_settings, start, end, [f"{db}.t"])

    assert summary(changes) == [
        ("c", "t", None, 1), ("c", "t", None, 2), ("c", "t", None, 3),
        ("u", "t", 1, 1), ("u", "t", 2, 2),
        ("u", "t", 3, 30),
        ("d", "t", 1, None), ("d", "t", 30, None),
    ]  # fmt: skip
    first = changes[0].after
    assert first == {"id": 1, "v": "a", "d": Decimal("1.50"), "ts": dt.datetime(2026, 1, 2, 3, 4, 5, 123456),
                     "j": '{"k": [1, 2]}'}  # fmt: skip
    assert isinstance(first["j"], str)  # MariaDB JSON is LONGTEXT in the binlog: raw str
    assert changes[3].before == first and changes[3].after == {**first, "v": "a!"}
    assert changes[1].after == {"id": 2, "v": "b", "d": None, "ts": None, "j": None}
    # multi-row statements: one rows event, rows indexed in order, one transaction each
    assert [c.row_index for c in changes[:3]] == [0, 1, 2]
    assert len({c.event_pos for c in changes[:3]}) == 1
    assert len({c.tx_offset for c in changes}) == 4
    assert [c.order_key for c in changes] == sorted(c.order_key for c in changes)
    assert all(t0 <= c.commit_ts <= t1 for c in changes)  # epoch seconds of the statements
    assert reader.reached_end and reader.stop_reason == "end" and reader.position == end
    assert reader.transactions_read == 4

    final = last_change_per_key(changes, ["id"])
    assert {k: c.after for k, c in final.items()} == {(1,): None, (2,): {**changes[4].after}, (3,): None, (30,): None}


def test_convert_is_applied_to_both_images(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v INT)")
    start = current_offset(cdc_conn)
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (1, 10)", f"UPDATE `{db}`.t SET v = 11", f"DELETE FROM `{db}`.t")
    end = current_offset(cdc_conn)
    seen: list[str] = []

    def convert(table: str, row: dict[str, Any], none_sources: Any = None) -> dict[str, Any]:
        seen.append(table)
        return {k: f"{k}={v}" for k, v in row.items()}

    changes, _ = read(cdc_settings, start, end, [f"{db}.t"], convert=convert)
    assert [(c.before, c.after) for c in changes] == [
        (None, {"id": "id=1", "v": "v=10"}),
        ({"id": "id=1", "v": "v=10"}, {"id": "id=1", "v": "v=11"}),
        ({"id": "id=1", "v": "v=11"}, None),
    ]
    assert seen == [f"{db}.t"] * 4


def test_table_filter_is_exact_db_dot_table(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    # only_tables/only_schemas of python-mysql-replication filter by name separately: asking for
    # db1.a and db2.b would let db1.b and db2.a through. The reader must not.
    db2 = f"{db}_2"
    mariadb.execute(f"CREATE DATABASE `{db2}`")
    try:
        for d in (db, db2):
            for t in ("a", "b", "c"):
                mariadb.execute(f"CREATE TABLE `{d}`.{t} (id INT PRIMARY KEY)")
        start = current_offset(cdc_conn)
        mariadb.execute(
            "BEGIN",
            *(f"INSERT INTO `{d}`.{t} VALUES ({i})" for i, (d, t) in enumerate(
                [(db, "a"), (db, "b"), (db, "c"), (db2, "a"), (db2, "b"), (db2, "c")])),
            "COMMIT",
        )  # fmt: skip
        end = current_offset(cdc_conn)
        changes, _ = read(cdc_settings, start, end, [f"{db}.a", f"{db2}.b"])
        assert [(c.table, c.after) for c in changes] == [(f"{db}.a", {"id": 0}), (f"{db2}.b", {"id": 4})]
        everything, _ = read(cdc_settings, start, end, None)
        assert [c.table for c in everything if c.table.startswith(db)] == [
            f"{d}.{t}" for d in (db, db2) for t in ("a", "b", "c")
        ]
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS `{db2}`")


def test_empty_range_reads_nothing(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    here = current_offset(cdc_conn)
    changes, reader = read(cdc_settings, here, here, None, blocking=True, timeout=SAFETY_TIMEOUT)
    assert changes == [] and reader.reached_end and reader.stop_reason == "end" and reader.position == here


# ------------------------------------------------------------------------- positions vs the server


def test_positions_match_show_binlog_events(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    """Every derived position is one the server lists: rows events, GTID starts, transaction ends."""
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v TEXT)")
    start = current_offset(cdc_conn)
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (1, 'x')")
    mariadb.execute("BEGIN", f"INSERT INTO `{db}`.t VALUES (2, REPEAT('y', 20000))",
                    "SAVEPOINT s1", f"UPDATE `{db}`.t SET v = 'z'", "COMMIT")  # fmt: skip
    mariadb.flush_binary_logs()
    mariadb.execute(f"ALTER TABLE `{db}`.t ADD COLUMN w INT")  # a standalone (DDL) transaction
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (3, 'w', 7)")
    mariadb.flush_binary_logs()
    mariadb.execute(f"DELETE FROM `{db}`.t WHERE id = 1")
    end = current_offset(cdc_conn)

    events = show_binlog_events(mariadb, start, end)
    by_pos = {(binlog_file_number(e["file"]), e["pos"]): e for e in events}
    changes, _ = read(cdc_settings, start, end, [f"{db}.t"])
    assert len(changes) == 6
    for c in changes:
        ev = by_pos[c.event_pos]
        assert ev["type"] in ("Write_rows_v1", "Update_rows_v1", "Delete_rows_v1"), ev
        gtid = by_pos[c.tx_offset.sort_key()]
        assert gtid["type"] == "Gtid" and gtid["file"] == c.tx_offset.file, gtid
    # the changes of the 4 DML transactions start at the server's GTID events of those transactions
    assert [c.tx_offset for c in changes] == [changes[0].tx_offset] + [changes[1].tx_offset] * 3 + [
        changes[4].tx_offset,
        changes[5].tx_offset,
    ]
    assert len({c.tx_offset for c in changes}) == 4
    assert changes[4].after == {"id": 3, "v": "w", "w": 7}  # column names follow the ALTER

    # Walk transaction by transaction: each stop is the end of a commit (Xid) or of the DDL query,
    # and each resumed read starts exactly there.
    tx_ends = {
        (binlog_file_number(e["file"]), e["end"])
        for e in events
        if e["type"] == "Xid" or (e["type"] == "Query" and e["info"].upper().startswith("ALTER"))
    }
    assert end.sort_key() in tx_ends
    pos, walked, stops = start, [], []
    while pos < end:
        part, reader = read(cdc_settings, pos, end, [f"{db}.t"], max_transactions=1)
        walked += part
        assert reader.transactions_read == 1
        assert reader.stop_reason == ("end" if reader.position == end else "max_transactions")
        assert reader.position.sort_key() in tx_ends, reader.position
        stops.append(reader.position)
        pos = reader.position
    assert len(stops) == 5  # insert, insert+update, ALTER, insert, delete
    assert summary(walked) == summary(changes)
    assert [c.order_key for c in walked] == [c.order_key for c in changes]


def test_tx_offset_is_show_master_status_before_the_transaction(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)", f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY)")
    before: dict[int, BinlogOffset] = {}
    start = current_offset(cdc_conn)
    for i in range(1, 7):
        if i == 4:
            mariadb.flush_binary_logs()
        if i % 2:
            mariadb.execute(f"INSERT INTO `{db}`.other VALUES ({i})")  # a transaction of another table
        before[i] = current_offset(cdc_conn)
        mariadb.execute("BEGIN", f"INSERT INTO `{db}`.t VALUES ({i})", f"INSERT INTO `{db}`.t VALUES ({i * 100})",
                        "COMMIT")  # fmt: skip
    end = current_offset(cdc_conn)
    changes, _ = read(cdc_settings, start, end, [f"{db}.t"])
    assert len(changes) == 12
    for c in changes:
        i = c.after["id"] if c.after["id"] < 100 else c.after["id"] // 100
        assert c.tx_offset == before[i] and c.tx_offset.file == before[i].file


# ------------------------------------------------------------------------------------- range ends


def test_transaction_committed_exactly_at_end(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    """end = SHOW MASTER STATUS right after a commit: that commit is in, the next one is out."""
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
    start = current_offset(cdc_conn)
    mariadb.execute("BEGIN", f"INSERT INTO `{db}`.t VALUES (1)", f"INSERT INTO `{db}`.t VALUES (2)", "COMMIT")
    hw = current_offset(cdc_conn)
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (3)")
    after = current_offset(cdc_conn)

    for blocking in (False, True):  # a blocking read must end at `end` too, not wait for more
        changes, reader = read(cdc_settings, start, hw, [f"{db}.t"], blocking=blocking, timeout=SAFETY_TIMEOUT)
        assert [c.after["id"] for c in changes] == [1, 2]
        assert reader.reached_end and reader.stop_reason == "end" and reader.position == hw

    rest, reader = read(cdc_settings, hw, after, [f"{db}.t"])
    assert [c.after["id"] for c in rest] == [3]
    assert rest[0].tx_offset == hw  # starts exactly at HW: "p >= HW" emits it
    assert all(c.tx_offset < hw for c in changes)
    assert reader.position == after


def test_flush_binary_logs_inside_the_range(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    # end's position in its (new) file is far smaller than start's: a reader comparing positions
    # without the file (end_log_pos) would stop at once.
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, pad VARCHAR(2000))")
    mariadb.execute(f"INSERT INTO `{db}`.t SELECT seq, REPEAT('p', 2000) FROM seq_1000_to_1200", database=db)
    start = current_offset(cdc_conn)
    expected = []
    for i in range(1, 9):
        mariadb.execute(f"INSERT INTO `{db}`.t VALUES ({i}, 'x')")
        expected.append(i)
        if i % 2 == 0:
            mariadb.flush_binary_logs()
    mariadb.flush_binary_logs(2)  # empty files inside the range too
    end = current_offset(cdc_conn)
    assert end.file_number >= start.file_number + 5 and end.pos < start.pos
    changes, reader = read(cdc_settings, start, end, [f"{db}.t"])
    assert [c.after["id"] for c in changes] == expected
    assert len({c.tx_offset.file for c in changes}) == 4
    assert reader.reached_end and reader.position == end
    # ending in the middle of the rotations: end = after the 4th insert and its FLUSH
    rows = [c for c in changes if c.after["id"] == 5]
    mid = rows[0].tx_offset
    first_half, reader = read(cdc_settings, start, mid, [f"{db}.t"])
    assert [c.after["id"] for c in first_half] == [1, 2, 3, 4]
    assert reader.position == mid


def test_resume_from_position_gives_exactly_the_rest(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v INT)", f"CREATE TABLE `{db}`.u (id INT PRIMARY KEY)")
    start = current_offset(cdc_conn)
    for i in range(10):
        # transactions of 1..4 rows, some mixing tables, rotations in between
        mariadb.execute("BEGIN", *(f"INSERT INTO `{db}`.t VALUES ({i * 10 + k}, {k})" for k in range(i % 4 + 1)),
                        f"INSERT INTO `{db}`.u VALUES ({i})", "COMMIT")  # fmt: skip
        mariadb.execute(f"UPDATE `{db}`.t SET v = v + 1 WHERE id = {i * 10}")
        if i % 3 == 2:
            mariadb.flush_binary_logs()
    end = current_offset(cdc_conn)
    tables = [f"{db}.t", f"{db}.u"]
    full, _ = read(cdc_settings, start, end, tables)
    assert len(full) == sum(i % 4 + 1 + 2 for i in range(10))

    # max_events smaller than a transaction: the read still ends at a transaction boundary
    pos, pieces, rounds = start, [], 0
    while True:
        part, reader = read(cdc_settings, pos, end, tables, max_events=2)
        rounds += 1
        pieces.append(part)
        if reader.reached_end:
            break
        assert reader.stop_reason == "max_events" and len(part) >= 2
        # the piece ends with a whole transaction: the next change belongs to a later one
        nxt = full[sum(len(p) for p in pieces)]
        assert nxt.tx_offset >= reader.position > part[-1].tx_offset
        pos = reader.position
    resumed = [c for p in pieces for c in p]
    assert [(c.table, c.op, c.before, c.after, c.order_key) for c in resumed] == [
        (c.table, c.op, c.before, c.after, c.order_key) for c in full
    ]
    assert rounds > 5


def test_non_blocking_without_end_reads_to_the_binlog_end(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
    start = current_offset(cdc_conn)
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (1)")
    mariadb.flush_binary_logs()
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (2)")
    now = current_offset(cdc_conn)
    changes, reader = read(cdc_settings, start, None, [f"{db}.t"])
    assert [c.after["id"] for c in changes] == [1, 2]
    assert reader.reached_end and reader.stop_reason == "eof" and reader.position == now
    # an end beyond the binlog's current end is not reached by a non-blocking read
    beyond = BinlogOffset(now.file, now.pos + 10_000)
    _, reader = read(cdc_settings, start, beyond, [f"{db}.t"])
    assert not reader.reached_end and reader.stop_reason == "eof" and reader.position == now


# ------------------------------------------------------------------------------------------- blocking


def test_blocking_read_waits_for_new_transactions_and_stops_at_a_boundary(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
    start = current_offset(cdc_conn)
    marks: dict[str, BinlogOffset] = {}

    existing = dump_threads(mariadb)

    def writer() -> None:
        wait_for_idle_dump(mariadb, existing)  # the reader has read everything and waits
        mariadb.execute("BEGIN", *(f"INSERT INTO `{db}`.t VALUES ({i})" for i in (1, 2, 3)), "COMMIT")
        with cdc_settings.connect() as conn:
            marks["after_t1"] = current_offset(conn)
        mariadb.execute(f"INSERT INTO `{db}`.t VALUES (4)")

    reader = BinlogRangeReader(cdc_settings, start, None, [f"{db}.t"], next(_ids), blocking=True,
                               heartbeat_seconds=0.2, timeout=SAFETY_TIMEOUT)  # fmt: skip
    got: list[int] = []
    with background(writer), reader:
        for ch in reader:
            got.append(ch.after["id"])
            reader.stop()  # asked after the first row: the reader finishes that transaction only
    assert got == [1, 2, 3]
    assert reader.stop_reason == "stop" and not reader.reached_end
    assert reader.position == marks["after_t1"]
    rest, _ = read(cdc_settings, reader.position, None, [f"{db}.t"])
    assert [c.after["id"] for c in rest] == [4]


def test_stop_from_another_thread_on_a_quiet_server(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    start = current_offset(cdc_conn)
    reader = BinlogRangeReader(cdc_settings, start, None, [f"{db}.t"], next(_ids), blocking=True,
                               heartbeat_seconds=0.2, timeout=SAFETY_TIMEOUT)  # fmt: skip

    existing = dump_threads(mariadb)

    def stopper() -> None:
        wait_for_idle_dump(mariadb, existing)
        reader.stop()

    with background(stopper), reader:
        changes = list(reader)
    assert changes == []
    assert reader.stop_reason == "stop"  # noticed through the heartbeat, not the safety timeout
    assert reader.position >= start


def test_blocking_timeout_and_max_transactions(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
    start = current_offset(cdc_conn)
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (1)", f"INSERT INTO `{db}`.t VALUES (2)")
    changes, reader = read(cdc_settings, start, None, [f"{db}.t"], blocking=True, heartbeat_seconds=0.2, timeout=2)
    assert reader.stop_reason == "timeout"  # ended on a quiet server (at a boundary: whole transactions)
    assert [c.after["id"] for c in changes] in ([], [1], [1, 2])
    changes, reader = read(cdc_settings, start, None, [f"{db}.t"], blocking=True, max_transactions=1,
                           timeout=SAFETY_TIMEOUT)  # fmt: skip
    assert [c.after["id"] for c in changes] == [1] and reader.stop_reason == "max_transactions"


def test_dump_connection_killed_while_idle_loses_nothing(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    """python-mysql-replication reconnects by itself after a lost connection; at a boundary that is safe."""
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
    start = current_offset(cdc_conn)
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (1)")

    existing = dump_threads(mariadb)

    def killer() -> None:
        mariadb.execute(f"KILL {wait_for_idle_dump(mariadb, existing)}")
        mariadb.execute(f"INSERT INTO `{db}`.t VALUES (2)")

    reader = BinlogRangeReader(cdc_settings, start, None, [f"{db}.t"], next(_ids), blocking=True,
                               heartbeat_seconds=0.2, max_events=2, timeout=SAFETY_TIMEOUT)  # fmt: skip
    with background(killer), reader:
        got = [c.after["id"] for c in reader]
    assert got == [1, 2] and reader.stop_reason == "max_events"


def test_connection_lost_inside_a_transaction_loses_nothing(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    """python-mysql-replication reconnects mid-transaction; the reader must neither drop nor repeat rows.

    The transaction is far larger than the socket buffers, so after the kill the client runs out of
    buffered events before the transaction ends and has to reconnect in the middle of it (the
    TABLE_MAP events are behind it by then: dropping the table map there would skip every row).
    """
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, pad VARCHAR(1000))")
    start = current_offset(cdc_conn)
    mariadb.execute(f"INSERT INTO `{db}`.t SELECT seq, REPEAT('p', 1000) FROM seq_1_to_30000", database=db)
    end = current_offset(cdc_conn)
    existing = dump_threads(mariadb)
    reader = BinlogRangeReader(cdc_settings, start, end, [f"{db}.t"], next(_ids))
    got: list[int] = []
    with reader:
        for ch in reader:
            got.append(ch.after["id"])
            if len(got) == 1:
                new = [t for t in dump_threads(mariadb) if t not in existing]
                assert len(new) == 1
                mariadb.execute(f"KILL {new[0]}")
                assert new[0] not in dump_threads(mariadb)
    assert got == list(range(1, 30001))
    assert reader.reached_end and reader.position == end


# ------------------------------------------------------------------------------ errors (private server)


def test_purged_start_file_raises_with_the_fix(private_server: MariaDBServer) -> None:
    srv, settings = private_server, private_server.cdc_settings()
    srv.execute("CREATE DATABASE IF NOT EXISTS p", "CREATE TABLE p.t (id INT PRIMARY KEY)")
    with settings.connect() as conn:
        old = current_offset(conn)
        srv.execute(
            "INSERT INTO p.t VALUES (1)", "FLUSH BINARY LOGS", "INSERT INTO p.t VALUES (2)", "FLUSH BINARY LOGS"
        )
        kept = current_offset(conn)
        srv.execute("INSERT INTO p.t VALUES (3)")
        srv.purge_binary_logs_to(kept.file)
        assert kept.file_number > old.file_number
        with pytest.raises(BinlogUnavailableError, match=r"has been purged.*re-snapshot.*binlog_expire_logs_seconds"):
            read(settings, old, None, ["p.t"])
        changes, _ = read(settings, kept, None, ["p.t"])
        assert [c.after["id"] for c in changes] == [3]


def test_position_inside_an_event_is_refused_clearly(private_server: MariaDBServer) -> None:
    srv, settings = private_server, private_server.cdc_settings()
    with settings.connect() as conn:
        here = current_offset(conn)
    srv.execute("CREATE DATABASE IF NOT EXISTS q", "CREATE TABLE IF NOT EXISTS q.t (id INT PRIMARY KEY)",
                "INSERT INTO q.t VALUES (1)")  # fmt: skip
    with pytest.raises(BinlogUnavailableError, match="transaction boundary"):
        read(settings, BinlogOffset(here.file, here.pos + 5), None, ["q.t"])


def test_missing_column_names_name_the_setting(private_server: MariaDBServer) -> None:
    srv, settings = private_server, private_server.cdc_settings()
    srv.execute("CREATE DATABASE IF NOT EXISTS m", "CREATE TABLE IF NOT EXISTS m.t (id INT PRIMARY KEY, v INT)")
    with settings.connect() as conn:
        start = current_offset(conn)
        srv.execute("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
        try:
            srv.execute("INSERT INTO m.t VALUES (1, 1)")
        finally:
            srv.execute("SET GLOBAL binlog_row_metadata = 'FULL'")
        fixed = current_offset(conn)
        srv.execute("INSERT INTO m.t VALUES (2, 2)")
        end = current_offset(conn)
    with pytest.raises(BinlogReadError, match=r"binlog_row_metadata=FULL"):
        read(settings, start, end, ["m.t"])
    # events written after the fix decode normally
    tail, _ = read(settings, fixed, end, ["m.t"])
    assert [c.after for c in tail] == [{"id": 2, "v": 2}]


def test_partial_row_images_name_the_setting(private_server: MariaDBServer) -> None:
    srv, settings = private_server, private_server.cdc_settings()
    srv.execute("CREATE DATABASE IF NOT EXISTS r", "CREATE TABLE IF NOT EXISTS r.t (id INT PRIMARY KEY, v INT, w INT)",
                "INSERT INTO r.t VALUES (1, 1, 1)")  # fmt: skip
    with settings.connect() as conn:
        start = current_offset(conn)
        srv.execute("SET SESSION binlog_row_image = 'MINIMAL'", "UPDATE r.t SET v = 2 WHERE id = 1")
        end = current_offset(conn)
    with pytest.raises(BinlogReadError, match=r"binlog_row_image=FULL"):
        read(settings, start, end, ["r.t"])


def test_convert_tells_empty_set_from_null(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    """A nullable SET holding the empty set must arrive as '' (not NULL) through the reader."""
    from airflow_provider_mysqlcdc.core.table import TableId
    from airflow_provider_mysqlcdc.mysql.binlog_values import binlog_row_converter
    from airflow_provider_mysqlcdc.mysql.schema import read_table_schema

    mariadb.execute(f"CREATE TABLE `{db}`.s (id INT PRIMARY KEY, tags SET('a','b') NULL)")
    conv = binlog_row_converter(read_table_schema(cdc_conn, TableId(db, "s")))
    start = current_offset(cdc_conn)
    mariadb.execute(
        f"INSERT INTO `{db}`.s VALUES (1, ''), (2, NULL), (3, 'b,a')", f"UPDATE `{db}`.s SET tags = '' WHERE id = 3"
    )
    end = current_offset(cdc_conn)
    changes, _ = read(cdc_settings, start, end, [f"{db}.s"], convert=lambda t, v, ns: conv(v, ns))
    assert [c.after["tags"] for c in changes] == ["", None, "a,b", ""]
    assert changes[3].before["tags"] == "a,b"
