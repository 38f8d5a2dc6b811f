"""A chunk's own window replayed in its task (snapshot/chunk_replay.py), against a real MariaDB.

The replay reads its window with a one-shot binlog read (server_id 0): any number of them run
beside the pipeline's registered readers without kicking one off. A window the task cannot replay
(too large, over two binlog files, or an unreadable source) is left to the group, never half-done.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.predicate import split_condition
from airflow_provider_mysqlcdc.mysql import server as source_server
from airflow_provider_mysqlcdc.mysql.binlog_reader import ONE_SHOT_SERVER_ID, BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.snapshot.chunk_replay import ChunkReplay
from airflow_provider_mysqlcdc.snapshot.native_reader import chunk_query, connection_uri
from tests.integration.test_snapshot_group import _make_table as _items


def _replay_for(settings: ConnectionSettings, table: str, chunk: int, **kw: Any) -> tuple[ChunkReplay, Any, Any]:
    with settings.connect() as conn:
        plan = plan_snapshot(conn, [table], 500, 3)
    schema = plan.tables[table]
    split = plan.splits[chunk]
    replay = ChunkReplay(schema, cdc_types.arrow_schema(schema), ChunkLocator(plan.splits, plan.collations),
                         (split.split_id,), ("id",), tuple(split.key_names), **kw)  # fmt: skip
    return replay, schema, split


def _read_chunk(settings: ConnectionSettings, schema: Any, split: Any) -> pa.Table:
    import connectorx as cx

    from airflow_provider_mysqlcdc.core import projection

    raw = cx.read_sql(connection_uri(settings), chunk_query(schema, split_condition(split)), return_type="arrow")
    return projection.canonicalize_native(raw, schema)


def _rows(t: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(zip(t.column("id").to_pylist(), t.column("v").to_pylist(), t.column("s").to_pylist(), strict=True))


def _offset(settings: ConnectionSettings, consistent: bool = False) -> Any:
    with settings.connect() as conn:
        if consistent:
            off = source_server.begin_consistent_snapshot(conn)
            conn.commit()
            return off
        return source_server.current_offset(conn)


def test_replay_brings_the_chunk_to_its_high_watermark(mariadb, db, cdc_settings) -> None:  # type: ignore[no-untyped-def]
    table = _items(mariadb, db)
    replay, schema, split = _replay_for(cdc_settings, table, 1)  # ids 501..1000
    low = _offset(cdc_settings, consistent=True)
    mariadb.execute(f"UPDATE {table} SET v = -610 WHERE id = 610")  # before the read: already in it
    rows = _read_chunk(cdc_settings, schema, split)
    mariadb.execute(
        f"UPDATE {table} SET v = -1, s = 'upd' WHERE id = 600",
        f"DELETE FROM {table} WHERE id = 601",
        f"UPDATE {table} SET id = 5000 WHERE id = 602",  # moved out of the chunk
        f"DELETE FROM {table} WHERE id = 603",
        f"UPDATE {table} SET id = 603 WHERE id = 2000",  # moved into it from another chunk
        f"DELETE FROM {table} WHERE id = 700",
        f"INSERT INTO {table} VALUES (700, 7, 'reinserted')",
        f"UPDATE {table} SET v = -10 WHERE id = 10",  # another chunk: not this chunk's business
        f"UPDATE {table} SET id = 999999 WHERE id = 11",
        f"UPDATE {table} SET v = v + 1 WHERE id BETWEEN 800 AND 849",  # one event, many rows
    )
    for v in range(4):
        mariadb.execute(f"UPDATE {table} SET v = {100 + v} WHERE id = 650")  # the last image wins
    high = _offset(cdc_settings)

    out = replay.replay(cdc_settings, rows, 0, low, high)

    assert out is not None
    expected = sorted(mariadb.query(f"SELECT id, v, s FROM {table} WHERE {split_condition(split)}"))
    assert _rows(out.rows) == expected
    assert out.rows.schema == cdc_types.arrow_schema(schema)
    assert out.changes == 1 + 1 + 1 + 1 + 1 + 2 + 50 + 4 + 1  # 610 again, and only this chunk's halves


def test_an_empty_window_is_no_read(mariadb, db, cdc_settings) -> None:  # type: ignore[no-untyped-def]
    table = _items(mariadb, db)
    replay, schema, split = _replay_for(cdc_settings, table, 0)
    rows = _read_chunk(cdc_settings, schema, split)
    here = _offset(cdc_settings)
    bad = ConnectionSettings(host="127.0.0.1", port=1, user="nobody", password="x")  # never connected to
    out = replay.replay(bad, rows, 0, here, here)
    assert out is not None and out.changes == 0 and out.rows is rows


def test_windows_it_cannot_replay_are_left_to_the_group(mariadb, db, cdc_settings, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level("INFO", logger="airflow_provider_mysqlcdc.snapshot.chunk_replay")
    table = _items(mariadb, db)
    replay, schema, split = _replay_for(cdc_settings, table, 1, max_window_bytes=64)
    low = _offset(cdc_settings, consistent=True)
    rows = _read_chunk(cdc_settings, schema, split)
    mariadb.execute(f"UPDATE {table} SET v = v + 1 WHERE id BETWEEN 501 AND 600")
    high = _offset(cdc_settings)
    assert replay.replay(cdc_settings, rows, 0, low, high) is None  # too large for a task
    assert "left to the group's replay" in caplog.text

    roomy, _, _ = _replay_for(cdc_settings, table, 1)
    mariadb.flush_binary_logs()
    mariadb.execute(f"UPDATE {table} SET v = v + 1 WHERE id = 501")
    assert roomy.replay(cdc_settings, rows, 0, low, _offset(cdc_settings)) is None  # over two binlog files

    low = _offset(cdc_settings, consistent=True)
    mariadb.execute(f"UPDATE {table} SET v = v + 1 WHERE id = 502")
    high = _offset(cdc_settings)
    unreachable = ConnectionSettings(host="127.0.0.1", port=cdc_settings.port, user="nobody", password="wrong")
    caplog.clear()
    assert roomy.replay(unreachable, rows, 0, low, high) is None  # the read failed: the group replays it
    assert "the group replays it" in caplog.text


def test_one_shot_reads_kick_no_registered_reader_off(mariadb, db, cdc_settings) -> None:  # type: ignore[no-untyped-def]
    """Several one-shot reads at once, beside a registered reader: all read their whole range."""
    table = _items(mariadb, db)
    start = _offset(cdc_settings)
    mariadb.execute(*[f"UPDATE {table} SET v = v + 1 WHERE id BETWEEN {i * 100 + 1} AND {i * 100 + 100}"
                      for i in range(20)])  # fmt: skip
    end = _offset(cdc_settings)
    registered: dict[str, Any] = {}

    def follow() -> None:
        try:
            with BinlogRangeReader(cdc_settings, start, None, [table], server_id=5999, blocking=True,
                                   max_events=2100) as r:  # fmt: skip
                registered["changes"] = sum(1 for _ in r)
        except Exception as exc:  # reported below
            registered["error"] = exc

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    counts: list[Any] = []

    def one_shot() -> None:
        try:
            with BinlogRangeReader(cdc_settings, start, end, [table], server_id=ONE_SHOT_SERVER_ID) as r:
                counts.append(sum(1 for _ in r))
        except Exception as exc:  # reported below
            counts.append(exc)

    shots = [threading.Thread(target=one_shot, daemon=True) for _ in range(4)]
    for t in shots:
        t.start()
    for t in shots:
        t.join(60)
    mariadb.execute(f"UPDATE {table} SET v = v + 1 WHERE id BETWEEN 1 AND 100")  # the follower's last 100
    follower.join(60)
    assert counts == [2000] * 4
    assert registered == {"changes": 2100}


def test_a_one_shot_read_must_be_bounded(cdc_settings) -> None:  # type: ignore[no-untyped-def]
    from airflow_provider_mysqlcdc.core.offset import BinlogOffset

    at = BinlogOffset("mysql-bin.000001", 4)
    with pytest.raises(ValueError, match="bounded"):
        BinlogRangeReader(cdc_settings, at, None, None, server_id=ONE_SHOT_SERVER_ID)
    with pytest.raises(ValueError, match="non-blocking"):
        BinlogRangeReader(cdc_settings, at, at, None, server_id=ONE_SHOT_SERVER_ID, blocking=True)
