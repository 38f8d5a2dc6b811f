"""The watermark-bracketed group snapshot against a real MariaDB and real Spark (local[2]).

Each concurrency test runs DML at one point of the algorithm (after LW before the SELECT, while the
SELECT is in flight, after the SELECT before HW) — inserts, updates, deletes, a key moved into a
chunk, a key moved out, rows on chunk boundaries, and binlog rotations — and then checks that
every chunk in the Delta table equals the source rows of that chunk as of the group's HW.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.predicate import split_condition
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import (
    SnapshotError,
    SnapshotOptions,
    SnapshotTestHooks,
    run_snapshot_group,
)
from airflow_provider_mysqlcdc.state import StateStore

ROWS = 3000
CHUNK = 500  # -> 6 chunks: [.., 501) [501, 1001) ... [2501, ..)
PER_GROUP = 3  # -> group 0 = chunks 0-2 (ids < 1501), group 1 = chunks 3-5


def _make_table(mariadb: Any, db: str) -> str:
    mariadb.execute(
        f"CREATE TABLE `{db}`.items (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(40))",
        f"INSERT INTO `{db}`.items SELECT seq, seq * 10, CONCAT('row-', seq) FROM seq_1_to_{ROWS}",
        database=db,
    )
    return f"{db}.items"


def _plan(cdc_settings: ConnectionSettings, store: StateStore, table: str, plan_id: str = "p1") -> Any:
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, [table], CHUNK, PER_GROUP)
    store.write_plan(plan_id, plan.to_dict())
    return plan


def _committed_rows(sink: DeltaSink, table: str) -> int:
    """Rows the lake holds for ``table``; 0 when a group failed before its Delta table was made
    (tables are created while the chunks are read)."""
    return sink.read(table).num_rows if sink.exists(table) else 0


def _delta_rows(sink: DeltaSink, table: str) -> list[tuple[Any, ...]]:
    t = sink.read(table)
    return sorted(zip(t.column("id").to_pylist(), t.column("v").to_pylist(), t.column("s").to_pylist(), strict=True))


def _source_rows(mariadb: Any, table: str, where: str = "1=1") -> list[tuple[Any, ...]]:
    return sorted(mariadb.query(f"SELECT id, v, s FROM {table} WHERE {where}"))


def _chunk_rows_now(mariadb: Any, plan: Any, group_id: int) -> dict[int, list[tuple[Any, ...]]]:
    g = next(g for g in plan.groups if g.group_id == group_id)
    return {s.split_id: _source_rows(mariadb, s.table, split_condition(s)) for s in g.splits}


def _assert_group_matches(sink: DeltaSink, plan: Any, table: str, group_id: int, expected: dict[int, list]) -> None:
    from airflow_provider_mysqlcdc.core.chunk import ChunkLocator

    loc = ChunkLocator([s for s in plan.splits if s.table == table])
    rows = _delta_rows(sink, table)
    ids = Counter(r[0] for r in rows)
    dups = [k for k, n in ids.items() if n > 1]
    assert not dups, f"duplicate keys in the sink: {dups[:10]}"
    got: dict[int, list] = {sid: [] for sid in expected}
    for r in rows:
        sid = loc.locate((r[0],)).split_id
        if sid in got:
            got[sid].append(r)
    for sid, exp in expected.items():
        assert sorted(got[sid]) == exp, f"chunk {sid} differs from the source as of HW"


def _dml_everything(mariadb: Any, table: str, rotate: bool) -> None:
    """Every kind of change, hitting chunks of group 0 (ids < 1501) and boundaries."""
    stmts = [
        f"INSERT INTO {table} VALUES (100000, 1, 'new beyond max')",  # last chunk's open end (group 1)
        f"INSERT INTO {table} VALUES (0, 2, 'new below min')",  # first chunk's open end
        f"UPDATE {table} SET v = -1, s = 'upd' WHERE id = 42",
        f"DELETE FROM {table} WHERE id = 43",
        f"UPDATE {table} SET id = 5001 WHERE id = 44",  # key moved out of group 0 into group 1's chunk
        f"DELETE FROM {table} WHERE id = 1600",
        f"UPDATE {table} SET id = 1600 WHERE id = 2999",  # key moved within group 1
        f"DELETE FROM {table} WHERE id = 49",
        f"UPDATE {table} SET id = 49 WHERE id = 2998",  # key moved into group 0's chunk from group 1
        f"UPDATE {table} SET id = 1200 + 0 * id WHERE id = 1200",  # no-op key rewrite
        f"UPDATE {table} SET v = -2 WHERE id = 501",  # row on a chunk boundary (start of chunk 1)
        f"DELETE FROM {table} WHERE id = 1001",  # boundary row deleted ...
        f"INSERT INTO {table} VALUES (1001, 3, 'boundary reinserted')",  # ... and re-inserted
        f"DELETE FROM {table} WHERE id = 1000",
        f"UPDATE {table} SET id = 1000 WHERE id = 46",  # moved to the last key before a boundary
        f"UPDATE {table} SET id = id + 10000 WHERE id BETWEEN 700 AND 709",  # multi-row key move out
    ]
    for i, s in enumerate(stmts):
        mariadb.execute(s)
        if rotate and i % 4 == 3:
            mariadb.flush_binary_logs()
    # several changes to one key in one window: the last one must win
    for v in range(5):
        mariadb.execute(f"UPDATE {table} SET v = {100 + v} WHERE id = 47")
    mariadb.execute(f"INSERT INTO {table} VALUES (48000, 4, 'x')")
    mariadb.execute(f"DELETE FROM {table} WHERE id = 48000")


@pytest.mark.parametrize("reader", ["native", "jdbc"])
@pytest.mark.parametrize("point", ["after_low_watermark", "during_read", "before_high_watermark"])
def test_concurrent_dml_at_each_point(point: str, reader: str, mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    plan = _plan(cdc_settings, store, table)
    assert len(plan.groups) == 2 and len(plan.splits) == 6

    opts = SnapshotOptions(reader=reader)
    # Group 1 first, with no concurrent DML; remember its chunks as of its HW.
    run_snapshot_group(spark, cdc_settings, store, "p1", 1, sink, opts)
    group1_at_hw = _chunk_rows_now(mariadb, plan, 1)

    fired: list[str] = []
    marks: dict[str, Any] = {}

    def dml() -> None:
        if point == "during_read":
            _wait_for_stalled_select(mariadb)  # chunk 0's SELECT is in flight, stalled at id 250
        marks["before"], marks["rows_before"] = _offset_now(cdc_settings), _chunk_rows_now(mariadb, plan, 0)
        # no rotations while the SELECT stalls: they are slow, and the DML must end inside the stall
        _dml_everything(mariadb, table, rotate=point != "during_read")
        marks["after"] = _offset_now(cdc_settings)
        fired.append(point)

    hooks = SnapshotTestHooks(**{point: dml})
    if point == "during_read":
        hooks.stall_reads_at = {table: ((250,), 8.0)}
    result = run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink, opts, test_hooks=hooks)
    assert fired == [point]
    if reader == "native" and point != "during_read":  # the DML is outside every chunk's own window
        assert result.window_changes == 0
    else:  # replayed: by chunk 0's task (native), by the group (JDBC)
        assert result.window_changes > 0
    group0_after_dml = _chunk_rows_now(mariadb, plan, 0)
    recs = store.read_all_results("p1")
    assert sorted((r.table, r.split_id) for r in recs) == [(table, i) for i in range(6)]
    own = {r.split_id: r for r in recs if r.group_id == 0}

    # Every chunk equals the source as of its own HW: before the DML when its HW precedes it, after
    # it when its HW follows it (with the native reader each chunk has its own watermarks; with
    # JDBC every chunk has the group's).
    group0_at_hw = {}
    for sid, r in own.items():
        assert result.low_watermark <= r.low_watermark <= r.high_watermark <= result.high_watermark
        if r.high_watermark <= marks["before"]:
            group0_at_hw[sid] = marks["rows_before"][sid]
        else:
            assert r.high_watermark >= marks["after"], f"chunk {sid}'s HW fell inside the test's DML"
            group0_at_hw[sid] = group0_after_dml[sid]
        assert r.rows == len(group0_at_hw[sid])
    if reader == "jdbc":
        assert {r.high_watermark for r in own.values()} == {result.high_watermark}
    elif point == "before_high_watermark":  # every chunk was read before the DML: the stream's to apply
        assert all(r.high_watermark <= marks["before"] for r in own.values())
    elif point == "during_read":  # chunk 0's own window holds the DML: replayed onto its rows
        assert own[0].low_watermark <= marks["before"] and own[0].high_watermark >= marks["after"]
    _assert_group_matches(sink, plan, table, 0, group0_at_hw)
    _assert_group_matches(sink, plan, table, 1, group1_at_hw)


def test_chunk_window_over_two_binlog_files_is_left_to_the_group(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A chunk's task replays only a window inside one binlog file; this one spans a rotation, so
    the group's replay brings the chunk to its HW instead (snapshot/chunk_replay.py)."""
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    plan = _plan(cdc_settings, store, table)

    def dml() -> None:
        _wait_for_stalled_select(mariadb)  # chunk 0's SELECT is in flight, stalled at id 250
        mariadb.execute(f"UPDATE {table} SET v = -1 WHERE id = 42", f"DELETE FROM {table} WHERE id = 43")
        mariadb.flush_binary_logs()
        mariadb.execute(f"UPDATE {table} SET id = 49000 WHERE id = 44", f"INSERT INTO {table} VALUES (0, 2, 'new')")

    hooks = SnapshotTestHooks(during_read=dml)
    hooks.stall_reads_at = {table: ((250,), 8.0)}
    result = run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink, SnapshotOptions(reader="native"),
                                test_hooks=hooks)  # fmt: skip
    chunk0 = next(r for r in store.read_all_results("p1") if r.split_id == 0)
    assert chunk0.low_watermark.file != chunk0.high_watermark.file
    assert result.replayed_in_task < len(plan.groups[0].splits)  # not chunk 0
    assert result.window_changes >= 4  # 42, 43, 44's delete-half, 0: chunk 0's
    _assert_group_matches(sink, plan, table, 0, _chunk_rows_now(mariadb, plan, 0))


def _wait_for_stalled_select(mariadb: Any, timeout: float = 120.0) -> None:
    """Until a chunk SELECT sits in its test stall (``SLEEP``) on the server, whatever the load."""
    deadline = time.monotonic() + timeout
    while not mariadb.query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() "
                            "AND STATE = 'User sleep' AND INFO LIKE 'SELECT%'")[0][0]:  # fmt: skip
        assert time.monotonic() < deadline, "no chunk SELECT reached its stall"
        time.sleep(0.05)


def _offset_now(settings: ConnectionSettings) -> Any:
    from airflow_provider_mysqlcdc.mysql.server import current_offset

    with settings.connect() as conn:
        return current_offset(conn)


def test_window_spans_rotation_and_many_files(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    plan = _plan(cdc_settings, store, table)

    def rotate_and_write() -> None:
        for i in range(6):
            mariadb.flush_binary_logs()
            mariadb.execute(f"UPDATE {table} SET v = v + 1 WHERE id BETWEEN {i * 200 + 1} AND {i * 200 + 50}")
        mariadb.flush_binary_logs()

    # JDBC chunks take the group's window, so the whole window, over seven binlog files, is replayed
    result = run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink, SnapshotOptions(reader="jdbc"),
                                test_hooks=SnapshotTestHooks(after_low_watermark=rotate_and_write))  # fmt: skip
    assert result.high_watermark.file_number >= result.low_watermark.file_number + 7
    assert result.window_changes == 6 * 50
    _assert_group_matches(sink, plan, table, 0, _chunk_rows_now(mariadb, plan, 0))


def test_skip_backfill_reports_low_watermark(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    _plan(cdc_settings, store, table)
    hooks = SnapshotTestHooks(before_high_watermark=lambda: mariadb.execute(f"DELETE FROM {table} WHERE id = 10"))
    res = run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink, SnapshotOptions(skip_backfill=True), hooks)
    assert res.high_watermark == res.low_watermark
    assert res.window_changes == 0


def test_rerun_of_a_committed_group_leaves_no_duplicates(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    plan = _plan(cdc_settings, store, table)
    for g in (0, 1, 0, 1):
        run_snapshot_group(spark, cdc_settings, store, "p1", g, sink)
    mariadb.execute(f"UPDATE {table} SET v = 7 WHERE id = 5")
    run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink)  # a retry sees newer data: replaces it
    assert _delta_rows(sink, table) == _source_rows(mariadb, table)
    assert len(plan.splits) == 6


def test_unreachable_server_fails_clearly(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    _plan(cdc_settings, store, table)
    from tests.support.mariadb import free_port

    bad = ConnectionSettings(**{**cdc_settings.__dict__, "port": free_port()})
    with pytest.raises(SnapshotError, match="cannot connect"):
        run_snapshot_group(spark, bad, store, "p1", 0, sink)
    assert not sink.exists(table) or sink.read(table).num_rows == 0
    assert store.read_group_report("p1", 0) is None


def test_missing_table_fails_clearly(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    _plan(cdc_settings, store, table)
    mariadb.execute(f"DROP TABLE {table}")
    with pytest.raises(SnapshotError, match="does not exist"):
        run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink)
    assert _committed_rows(sink, table) == 0
    assert store.read_group_report("p1", 0) is None


def test_revoked_replication_privilege_fails_clearly(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    _plan(cdc_settings, store, table)
    user = f"norepl_{db[-6:]}"
    mariadb.execute(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'",
        f"GRANT SELECT, REPLICATION CLIENT ON *.* TO '{user}'@'%'",
    )
    try:
        settings = ConnectionSettings(**{**cdc_settings.__dict__, "user": user, "password": "pw"})
        hooks = SnapshotTestHooks(after_low_watermark=lambda: mariadb.execute(f"UPDATE {table} SET v = 0 WHERE id = 3"))
        with pytest.raises(SnapshotError, match="REPLICATION SLAVE"):
            run_snapshot_group(spark, settings, store, "p1", 0, sink, test_hooks=hooks)
    finally:
        mariadb.execute(f"DROP USER '{user}'@'%'")
    assert _committed_rows(sink, table) == 0
    assert store.read_group_report("p1", 0) is None


WIDE = """CREATE TABLE {t} (
    id BIGINT UNSIGNED NOT NULL PRIMARY KEY, i8 TINYINT, u8 TINYINT UNSIGNED, d DECIMAL(20,6), f DOUBLE,
    dt DATETIME(6), ts TIMESTAMP(3) NULL, dd DATE, tm TIME(2), y YEAR, s VARCHAR(30) CHARACTER SET utf8mb4,
    c CHAR(4), b VARBINARY(8), bn BINARY(3), j JSON, e ENUM('x','y'), st SET('a','b'), bt BIT(5), b1 BIT(1)
)"""
# Two rows of every type: one of typical values, one of NULLs.
WIDE_ROWS = """
          (1, -5, 250, 12345.678901, 1.5, '2024-02-29 23:59:59.123456', '2024-01-01 00:00:00.5', '2024-02-29',
           '-12:34:56.78', 2024, 'héllo 😀', 'ab', X'00ff00', X'0100', '{"k": [1, "ü"]}', 'y', 'a,b', b'10101', b'1'),
          (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
              NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"""


def test_window_rows_of_every_type_match_the_source(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Rows added/changed in the window take the binlog path into the same files as the JDBC rows."""
    from tests.support.verify import compare

    t = f"`{db}`.wide"
    mariadb.execute(
        WIDE.format(t=t),
        f"""INSERT INTO {t} VALUES {WIDE_ROWS},
          (18446744073709551615, 127, 0, -0.000001, -2.25e10, '1970-01-01 00:00:00', NULL, '1000-01-01',
           '838:59:59', 1901, '', '', X'', X'', '[]', 'x', '', b'0', b'0')""",
    )
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, [f"{db}.wide"], 2, 64)
    store.write_plan("p1", plan.to_dict())

    def changes() -> None:
        mariadb.execute(
            "SET time_zone = '+05:00'",
            f"""INSERT INTO {t} VALUES (3, 1, 2, 3.5, 0.25, '2025-05-05 05:05:05.5', '2025-05-05 05:05:05.123',
              '2025-05-05',
              '100:00:00.01', 2155, 'neu', 'x', X'ab', X'ff', '{{"a": null}}', 'x', 'b', b'11111', b'1')""",
            f"UPDATE {t} SET i8 = 7, s = NULL, st = '', j = '{{}}', bn = X'61' WHERE id = 1",
            f"UPDATE {t} SET d = 1.5, tm = '-00:00:01', ts = '2030-01-01 00:00:00' WHERE id = 2",
            f"DELETE FROM {t} WHERE id = 18446744073709551615",
            f"INSERT INTO {t} (id) VALUES (18446744073709551614)",
        )

    # JDBC: its chunks take the group's window (a native chunk's own window ends before these changes)
    res = run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink, SnapshotOptions(reader="jdbc"),
                             test_hooks=SnapshotTestHooks(before_high_watermark=changes))  # fmt: skip
    assert res.window_changes == 5
    with cdc_settings.connect() as conn:
        cmp = compare(conn, plan.tables[f"{db}.wide"], sink.read(f"{db}.wide"))
    assert cmp.match, cmp.first_difference
    assert cmp.source_rows == 4


def test_chunk_window_rows_of_every_type_replayed_in_the_task(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Native reader: changes made while a chunk's SELECT runs are replayed by its own task
    (snapshot/chunk_replay.py) in the values the native reader stages, for every type."""
    from tests.support.verify import compare

    t = f"`{db}`.wide"
    mariadb.execute(
        WIDE.format(t=t),
        f"""INSERT INTO {t} VALUES {WIDE_ROWS},
          (9, 1, 1, 1, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
    )
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, [f"{db}.wide"], 3, 64)  # one chunk: every change is in its window
    store.write_plan("p1", plan.to_dict())

    def changes() -> None:
        _wait_for_stalled_select(mariadb)
        mariadb.execute(
            "SET time_zone = '+05:00'",
            f"""INSERT INTO {t} VALUES (3, 1, 2, 3.5, 0.25, '2025-05-05 05:05:05.5', '2025-05-05 05:05:05.123',
              '2025-05-05',
              '100:00:00.01', 2155, 'neu', 'x', X'ab', X'ff', '{{"a": null}}', 'x', 'b', b'11111', b'1')""",
            f"UPDATE {t} SET i8 = 7, s = NULL, st = '', j = '{{}}', bn = X'61', b = X'' WHERE id = 1",
            f"UPDATE {t} SET d = 1.5, tm = '-00:00:01', ts = '2030-01-01 00:00:00', e = 'x' WHERE id = 2",
            f"DELETE FROM {t} WHERE id = 9",
        )

    hooks = SnapshotTestHooks(during_read=changes)
    hooks.stall_reads_at = {f"{db}.wide": ((2,), 4.0)}
    res = run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink, SnapshotOptions(reader="native"),
                             test_hooks=hooks)  # fmt: skip
    assert res.replayed_in_task == 1 and res.window_changes == 4
    with cdc_settings.connect() as conn:
        cmp = compare(conn, plan.tables[f"{db}.wide"], sink.read(f"{db}.wide"))
    assert cmp.match, cmp.first_difference
    assert cmp.source_rows == 3


@pytest.mark.parametrize(
    ("point", "reader"),
    [("after_low_watermark", "native"), ("during_read", "native"), ("before_high_watermark", "jdbc")],
)
def test_case_insensitive_string_keys(point: str, reader: str, mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A key whose case changes in the window is one row under utf8mb4_general_ci, never two: in the
    group's window (JDBC) and in a chunk's own window (native, the DML while the chunk's SELECT runs;
    the DML touches that chunk's keys only, so the snapshot alone equals the source)."""
    from tests.support.verify import compare

    t = f"`{db}`.ci"
    mariadb.execute(
        f"CREATE TABLE {t} (k VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)",
        f"INSERT INTO {t} SELECT CONCAT(IF(seq % 2, 'k', 'K'), LPAD(seq, 4, '0')), seq FROM seq_1_to_400",
        database=db,
    )
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, [f"{db}.ci"], 50, 3)
    store.write_plan("p1", plan.to_dict())
    assert len(plan.groups) >= 2

    def changes() -> None:
        if point == "during_read":
            _wait_for_stalled_select(mariadb)  # chunk 0's SELECT is stalled at k0045
        mariadb.execute(
            f"UPDATE {t} SET k = 'K0001', v = -1 WHERE k = 'k0001'",  # case-only key change
            f"UPDATE {t} SET k = 'k0003 ' WHERE k = 'k0003'",  # trailing space: same key under PAD SPACE
            f"UPDATE {t} SET k = 'k0002' WHERE k = 'K0002'",
            f"UPDATE {t} SET k = 'K0002', v = 5 WHERE k = 'k0002'",  # back again, last image wins
            f"INSERT INTO {t} VALUES ('é-new', 1), ('A-first', 2)",
            f"DELETE FROM {t} WHERE k = " + ("'K0040'" if point == "during_read" else "'K0100'"),
        )

    for g in plan.groups:
        hooks = SnapshotTestHooks(**{point: changes}) if g.group_id == 0 else None
        if hooks is not None and point == "during_read":
            hooks.stall_reads_at = {f"{db}.ci": (("k0045",), 3.0)}
        result = run_snapshot_group(spark, cdc_settings, store, "p1", g.group_id, sink, SnapshotOptions(reader=reader),
                                    test_hooks=hooks)  # fmt: skip
        if hooks is not None and point != "after_low_watermark":
            assert result.window_changes > 0
    with cdc_settings.connect() as conn:
        cmp = compare(conn, plan.tables[f"{db}.ci"], sink.read(f"{db}.ci"))
    assert cmp.match, cmp.first_difference


def test_alter_table_during_the_snapshot_fails_the_group(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The chunks are read with the plan's columns: an ALTER inside the window must not lose a column."""
    table = _make_table(mariadb, db)
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    _plan(cdc_settings, store, table)
    hooks = SnapshotTestHooks(after_low_watermark=lambda: mariadb.execute(f"ALTER TABLE {table} ADD COLUMN z INT"))
    with pytest.raises(SnapshotError, match=r"changed since plan p1 .* trigger the DAG again"):
        run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink, test_hooks=hooks)
    assert _committed_rows(sink, table) == 0
    assert store.read_group_report("p1", 0) is None


def test_geometry_table_falls_back_to_jdbc_or_is_refused_by_reader_native(
    mariadb, db, cdc_settings, spark, tmp_path, caplog  # type: ignore[no-untyped-def]
) -> None:
    table = f"{db}.places"
    mariadb.execute(
        f"CREATE TABLE {table} (id INT NOT NULL PRIMARY KEY, p POINT, n VARCHAR(10))",
        f"INSERT INTO {table} VALUES (1, ST_GeomFromText('POINT(1 2)'), 'a'), (2, NULL, 'b')",
    )
    store = StateStore(str(tmp_path / "state"), "pipe")
    sink = DeltaSink(str(tmp_path / "lake"))
    _plan(cdc_settings, store, table)
    with pytest.raises(SnapshotError, match=r"native reader cannot read it: column 'p' holds GEOMETRY.*reader='jdbc'"):
        run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink, SnapshotOptions(reader="native"))
    assert _committed_rows(sink, table) == 0
    with caplog.at_level("INFO", logger="airflow_provider_mysqlcdc.snapshot.staging"):
        result = run_snapshot_group(spark, cdc_settings, store, "p1", 0, sink)
    assert result.rows == 2
    assert any("read with Spark JDBC: column 'p' holds GEOMETRY" in r.getMessage() for r in caplog.records)
    got = sink.read(table).sort_by("id")
    assert got.column("n").to_pylist() == ["a", "b"]
    assert got.column("p").to_pylist()[1] is None and len(got.column("p").to_pylist()[0]) == 25


def test_bad_reader_option_is_refused() -> None:
    with pytest.raises(ValueError, match="reader must be one of auto, native, jdbc"):
        SnapshotOptions(reader="odbc")
