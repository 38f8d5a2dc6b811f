"""GTID sets of both flavours: what a point in a binlog has behind it (core/gtid.py)."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.core.gtid import Gtid, GtidSet, GtidSetError
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, FinishedChunk, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset

A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
B = "4f22ab58-82db-22f2-af44-d91bb0530673"


def test_mysql_sets_contain_by_interval_uuid_and_tag() -> None:
    s = GtidSet.parse(f"{A.upper()}:1-5:7,\n{B}:3:ops:1-2")
    assert not s.mariadb
    assert s.contains(Gtid.parse(f"{A}:5")) and s.contains(Gtid.parse(f"{A}:7"))
    assert not s.contains(Gtid.parse(f"{A}:6"))
    assert s.contains(Gtid.parse(f"{B}:ops:2")) and not s.contains(Gtid.parse(f"{B}:2"))
    assert not s.contains(Gtid.parse(f"{B}:other:1"))
    assert str(s) == f"{A}:1-5:7,{B}:3:ops:1-2"
    assert GtidSet.parse(str(s)) == s


def test_mysql_added_merges_intervals_and_superset_compares_them() -> None:
    s = GtidSet.parse(f"{A}:1-5:7").added(Gtid.parse(f"{A}:6"))
    assert str(s) == f"{A}:1-7"
    assert s.issuperset(GtidSet.parse(f"{A}:2-4"))
    assert not GtidSet.parse(f"{A}:1-5").issuperset(s)
    assert s.issuperset(GtidSet.parse("", mariadb=False))
    assert not s.issuperset(GtidSet.parse(f"{B}:1"))
    tagged = s.added(Gtid.parse(f"{A}:t1:1"))
    assert tagged.contains(Gtid.parse(f"{A}:t1:1")) and str(tagged) == f"{A}:1-7:t1:1"


def test_mariadb_positions_contain_by_sequence_per_domain() -> None:
    s = GtidSet.parse("0-1-100,1-2-7")
    assert s.mariadb
    assert s.contains(Gtid.parse("0-2-100")) and not s.contains(Gtid.parse("0-2-101"))
    assert not s.contains(Gtid.parse("2-1-1"))
    moved = s.added(Gtid.parse("0-2-101"))  # a promoted replica writes the same domain, its own server id
    assert str(moved) == "0-2-101,1-2-7"
    assert moved.issuperset(s) and not s.issuperset(moved)
    assert GtidSet.parse("[0-1-4]", mariadb=True).contains(Gtid.parse("0-1-4"))  # a Gtid_list event's text
    assert GtidSet.parse("[]", mariadb=True).issuperset(GtidSet.parse("", mariadb=True))


@pytest.mark.parametrize("text", ["nonsense", "0-1", f"{A}:x-y", "12345:1"])
def test_unreadable_sets_are_refused(text: str) -> None:
    with pytest.raises(GtidSetError):
        GtidSet.parse(text, mariadb="-" in text and ":" not in text)
        Gtid.parse(text)


def test_offsets_carry_server_and_gtid_set_through_json_but_compare_by_position() -> None:
    a = BinlogOffset("mysql-bin.000002", 400, "0-1-9", "mariadb:1")
    assert BinlogOffset.from_json(a.to_json()) == a and BinlogOffset.from_json(a.to_json()).server == "mariadb:1"
    assert a == BinlogOffset("mysql-bin.000002", 400) and a.position().server is None


def test_a_rebased_manifest_translates_every_offset_into_a_new_generation() -> None:
    from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk

    old = BinlogOffset("mysql-bin.000002", 400, "0-1-9", "mariadb:1")
    chunk = SnapshotChunk("db.t", 0, ["id"], None, None)
    table = CapturedTable(None, ["id"], [FinishedChunk(chunk, old)], emptied_at=[old], ended_at=old)  # type: ignore[arg-type]
    m = Manifest.of({"db.t": table})
    new = BinlogOffset("mysql-bin.000007", 4, "0-1-9", "mariadb:2")
    rebased = m.rebased("p", lambda o: new)
    assert rebased.generation.number == m.generation.number + 1
    assert all(o.server == "mariadb:2" for o in rebased.offsets())
    assert all(o.server == "mariadb:1" for o in m.offsets())
