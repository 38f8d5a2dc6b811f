"""Changelog rows and the SCD2 view on plain data (core/changelog.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from airflow_provider_mysqlcdc.core.change_block import BlockBuilder, block_schema, changes_after, changes_before
from airflow_provider_mysqlcdc.core.changelog import (
    changelog_schema,
    changes_to_changelog,
    order_key,
    removed_to_changelog,
    reread_removed_tx,
    scd2,
    snapshot_to_changelog,
)
from airflow_provider_mysqlcdc.core.offset import BinlogOffset

TABLE = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
F = "mysql-bin.000002"


def _block(changes: list[tuple[str, int, int, dict | None, dict | None]], full_before: bool = True) -> pa.Table:
    b = BlockBuilder(block_schema(TABLE, ["id"], full_before))
    for seq, (op, pos, ts, before, after) in enumerate(changes):
        b.add(op, F, pos, 2, pos + 10, 0, seq, ts, before, after)
    return pa.Table.from_batches([b.build()])


def _ts(sec: int) -> datetime:
    return datetime.fromtimestamp(sec, UTC)


def test_changes_become_changelog_rows_with_their_binlog_positions() -> None:
    block = _block([("c", 100, 1000, None, {"id": 1, "v": "a"}),
                    ("u", 200, 1001, {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
                    ("d", 300, 1002, {"id": 1, "v": "b"}, None)])  # fmt: skip
    log = changes_to_changelog(block, TABLE)
    assert log.schema == changelog_schema(TABLE)
    rows = log.to_pylist()
    assert [r["_op"] for r in rows] == ["c", "u", "d"]
    assert [r["_tx_id"] for r in rows] == [f"{F}:100", f"{F}:200", f"{F}:300"]
    assert [(r["_binlog_file"], r["_binlog_pos"], r["_event_pos"]) for r in rows] == [
        (F, 100, 110), (F, 200, 210), (F, 300, 310)]  # fmt: skip
    assert rows[1]["before"] == {"id": 1, "v": "a"} and rows[1]["after"] == {"id": 1, "v": "b"}
    assert rows[0]["before"] is None and rows[2]["after"] is None
    assert rows[2]["_commit_ts"] == _ts(1002)


def test_a_key_only_before_image_is_widened_with_nulls() -> None:
    block = _block([("u", 100, 1000, {"id": 1}, {"id": 1, "v": "b"}), ("c", 200, 1001, None, {"id": 2, "v": "x"})],
                   full_before=False)  # fmt: skip
    rows = changes_to_changelog(block, TABLE).to_pylist()
    assert rows[0]["before"] == {"id": 1, "v": None}
    assert rows[1]["before"] is None


def test_scd2_versions_end_at_the_next_event_of_their_key() -> None:
    snap = snapshot_to_changelog(pa.table({"id": [1, 5], "v": ["a", "e"]}, schema=TABLE), TABLE,
                                 BinlogOffset(F, 50), 900.0, "snapshot:p1:0")  # fmt: skip
    block = _block([("u", 100, 1000, {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
                    ("u", 200, 1001, {"id": 1, "v": "b"}, {"id": 2, "v": "b"}),  # key move 1 -> 2
                    ("c", 300, 1002, None, {"id": 3, "v": "c"}),
                    ("d", 400, 1003, {"id": 3, "v": "c"}, None),
                    ("u", 500, 1004, {"id": 5, "v": "e"}, {"id": 5, "v": "f"})])  # fmt: skip
    log = pa.concat_tables([changes_to_changelog(block, TABLE), snap])  # unordered, as read back
    assert order_key(log).column("_op").to_pylist() == ["r", "r", "u", "u", "c", "d", "u"]
    hist = sorted(scd2(log, ["id"]).to_pylist(), key=lambda r: (r["id"], r["valid_from"]))
    got = [(r["id"], r["v"], r["_op"], r["valid_to"], r["is_current"]) for r in hist]
    assert got == [
        (1, "a", "r", _ts(1000), False),
        (1, "b", "u", _ts(1001), False),  # ended by the move to key 2
        (2, "b", "u", None, True),
        (3, "c", "c", _ts(1003), False),  # ended by its delete
        (5, "e", "r", _ts(1004), False),
        (5, "f", "u", None, True),
    ]
    current = sorted((r["id"], r["v"]) for r in hist if r["is_current"])
    assert current == [(2, "b"), (5, "f")]


def test_an_empty_changelog_has_an_empty_history() -> None:
    empty = changelog_schema(TABLE).empty_table()
    out = scd2(empty, ["id"])
    assert out.num_rows == 0 and "valid_from" in out.schema.names


def test_rows_a_truncate_removed_end_their_versions_at_it() -> None:
    """A TRUNCATE at pos 250 logs no row event: its deletes (removed_to_changelog) close the versions."""
    block = _block([("u", 100, 1000, {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
                    ("c", 300, 1002, None, {"id": 7, "v": "n"})])  # fmt: skip
    at = BinlogOffset(F, 250)
    assert changes_before(block, at.sort_key()).column("pos").to_pylist() == [100]
    assert changes_after(block, at.sort_key()).column("pos").to_pylist() == [300]
    removed = removed_to_changelog(pa.table({"id": [1, 5], "v": ["b", "e"]}, schema=TABLE), TABLE, at, 1001.0)
    assert removed.column("_op").to_pylist() == ["d", "d"] and removed.column("after").null_count == 2
    snap = snapshot_to_changelog(pa.table({"id": [1, 5], "v": ["a", "e"]}, schema=TABLE), TABLE,
                                 BinlogOffset(F, 50), 900.0, "snapshot:p1:0")  # fmt: skip
    log = pa.concat_tables([changes_to_changelog(block, TABLE), removed, snap])
    assert order_key(log).column("_op").to_pylist() == ["r", "r", "u", "d", "d", "c"]
    hist = sorted(scd2(log, ["id"]).to_pylist(), key=lambda r: (r["id"], r["valid_from"]))
    assert [(r["id"], r["v"], r["valid_to"], r["is_current"]) for r in hist] == [
        (1, "a", _ts(1000), False), (1, "b", _ts(1001), False), (5, "e", _ts(1001), False), (7, "n", None, True),
    ]


def test_a_changelog_complete_to_an_offset_logs_only_the_changes_from_there() -> None:
    """A generation replaying behind where the changelog is complete (``changelog_from``) logs only the
    transactions starting at or after it: the earlier ones are in the changelog already."""
    block = _block([("c", 100, 1000, None, {"id": 1, "v": "a"}),
                    ("u", 200, 1001, {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
                    ("d", 300, 1002, {"id": 1, "v": "b"}, None)])  # fmt: skip
    assert changes_to_changelog(block, TABLE, BinlogOffset(F, 200)).column("_binlog_pos").to_pylist() == [200, 300]
    assert changes_to_changelog(block, TABLE, BinlogOffset(F, 201)).column("_binlog_pos").to_pylist() == [300]
    assert changes_to_changelog(block, TABLE, BinlogOffset("mysql-bin.000003", 4)).num_rows == 0
    assert changes_to_changelog(block, TABLE, BinlogOffset("mysql-bin.000001", 9999)).num_rows == 3
    assert changes_to_changelog(block, TABLE, None).num_rows == 3


def test_a_row_a_reread_found_gone_ends_its_version_at_the_reread() -> None:
    """A re-read at HW 400 that no longer finds id 5 (removed with no binlog event) logs a 'd' at 400
    under its own transaction id; id 1, read again, gets a new version as op r."""
    snap = snapshot_to_changelog(pa.table({"id": [1, 5], "v": ["a", "e"]}, schema=TABLE), TABLE,
                                 BinlogOffset(F, 50), 900.0, "snapshot:p1:0")  # fmt: skip
    again = snapshot_to_changelog(pa.table({"id": [1], "v": ["a"]}, schema=TABLE), TABLE, BinlogOffset(F, 400),
                                  1100.0, "snapshot:r2:0")  # fmt: skip
    gone = removed_to_changelog(pa.table({"id": [5], "v": ["e"]}, schema=TABLE), TABLE, BinlogOffset(F, 400), 1100.0,
                                reread_removed_tx("r2"))  # fmt: skip
    assert gone.column("_tx_id").to_pylist() == ["snapshot:r2:removed"]
    hist = sorted(scd2(pa.concat_tables([snap, again, gone]), ["id"]).to_pylist(),
                  key=lambda r: (r["id"], r["valid_from"]))  # fmt: skip
    assert [(r["id"], r["valid_to"], r["is_current"], r["_tx_id"]) for r in hist] == [
        (1, _ts(1100), False, "snapshot:p1:0"),
        (1, None, True, "snapshot:r2:0"),
        (5, _ts(1100), False, "snapshot:p1:0"),
    ]
