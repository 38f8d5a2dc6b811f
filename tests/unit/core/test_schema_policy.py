"""The schema-change policy: an ALTER judged by its effect on the columns; each DDL per policy."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_mysqlcdc.core.capture_selection import CaptureSelection
from airflow_provider_mysqlcdc.core.change_block import changes_after
from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import INT, KeyColumn
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, FinishedChunk, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.schema_policy import (
    EVOLVE,
    FAIL,
    LENIENT,
    ColumnDiff,
    check_policy,
    column_diff,
    decide_alter,
    decide_table_ddl,
)
from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema


def col(name: str, column_type: str = "int(11)", nullable: bool = True) -> ColumnInfo:
    return ColumnInfo(name, 1, column_type.split("(")[0], column_type, nullable)


def schema(*cols: ColumnInfo, pk: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(TableId("shop", "t"), [col("id", "bigint(20)", False), *cols], list(pk))


OLD = schema(col("a"), col("note", "varchar(20)"), col("gone"))


def test_column_diff_tells_renames_from_drops_and_adds() -> None:
    new = schema(col("a", "bigint(20)"), col("label", "varchar(20)"), col("fresh"))
    d = column_diff(OLD, new, {"note": "label", "nowhere": "x"})
    assert d == ColumnDiff(added=("fresh",), dropped=("gone",), renamed={"note": "label"}, modified=("a",))
    assert "renamed note to label" in d.describe() and d.changed
    # without the statement's renames a rename is a drop plus an add
    plain = column_diff(OLD, new)
    assert plain.renamed == {} and set(plain.dropped) == {"note", "gone"} and set(plain.added) == {"label", "fresh"}
    # names compare case-insensitively, as MySQL's do; nullability counts as a modification
    assert not column_diff(OLD, schema(col("A"), col("NOTE", "varchar(20)"), col("gone"))).changed
    not_null = schema(col("a", nullable=False), col("note", "varchar(20)"), col("gone"))
    assert column_diff(OLD, not_null).modified == ("a",)
    rekeyed = schema(col("a"), col("note", "varchar(20)"), col("gone"), pk=("id", "a"))
    assert column_diff(OLD, rekeyed).key_changed


@pytest.mark.parametrize("policy", [EVOLVE, LENIENT, FAIL])
def test_an_alter_per_policy(policy: str) -> None:
    d = ColumnDiff(added=("x",), dropped=("gone",), renamed={"note": "label"})
    a = decide_alter("shop.t", d, policy, "ALTER of shop.t at b.1:4 (...)")
    if policy == FAIL:
        assert a.stop and "schema_change_policy is 'fail'" in a.stop and "resnapshot_tables=['shop.t']" in a.stop
        assert "ALTER of shop.t at b.1:4" in a.stop
    elif policy == EVOLVE:
        assert not a.stop and a.drop_columns == ("gone",) and a.rename_columns == {"note": "label"}
        assert a.retire_columns == ()
        assert a.note == ("added x; gone dropped at the source and in the lake (evolve); note renamed to label at the "
                          "source and in the lake (evolve)")  # fmt: skip
    else:
        assert not a.stop and a.retire_columns == ("gone", "note") and not a.drop_columns and not a.rename_columns
        # says where each thing happened (it read "dropped gone; kept gone")
        assert a.note == ("added x; gone dropped at the source; kept in the lake (lenient: NULL from now on); note "
                          "renamed to label at the source; label added in the lake, note kept (lenient: NULL from "
                          "now on)")  # fmt: skip
    # an ALTER that changes no column (an index) passes under every policy, even fail
    assert decide_alter("shop.t", ColumnDiff(), policy, "ALTER").stop is None
    # a changed primary key stops under every policy, naming a re-snapshot
    key = decide_alter("shop.t", ColumnDiff(key_changed=True), policy, "ALTER")
    assert key.stop and "primary key" in key.stop and "resnapshot_tables=['shop.t']" in key.stop


@pytest.mark.parametrize("policy", [EVOLVE, LENIENT, FAIL])
@pytest.mark.parametrize("kind", ["truncate", "drop", "rename", "replace"])
def test_table_ddl_per_policy(policy: str, kind: str) -> None:
    a = decide_table_ddl("shop.t", kind, policy, f"{kind.upper()} of shop.t")
    if policy == FAIL:
        assert a.stop and f"{kind.upper()} of shop.t" in a.stop
        return
    assert a.stop is None
    assert a.empty == (policy == EVOLVE)  # lenient never removes rows from the lake
    assert a.end == (kind != "truncate")
    swap = decide_table_ddl("shop.t", "rename", policy, "RENAME", swap=True)
    assert swap.end and not swap.empty  # a cut-over keeps the table and its rows


def test_a_created_table_is_captured_unless_the_policy_is_fail() -> None:
    assert decide_table_ddl("shop.n", "create", FAIL, "CREATE of shop.n").stop
    for policy in (EVOLVE, LENIENT):
        a = decide_table_ddl("shop.n", "create", policy, "CREATE of shop.n")
        assert a.stop is None and not a.end and not a.empty


def test_unknown_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="evolve, lenient, fail"):
        check_policy("ignore-all")


def test_manifest_records_the_decisions() -> None:
    chunk = SnapshotChunk("shop.t", 0, (KeyColumn("id", INT),), None, None)
    entry = CapturedTable(OLD, ["id"], [FinishedChunk(chunk, BinlogOffset("b.000001", 4))])
    entry.retired_columns = ["gone"]
    entry.renamed_columns = {"note": "label"}
    entry.emptied_at = [BinlogOffset("b.000001", 100)]
    entry.ended_at = BinlogOffset("b.000002", 4)
    m = Manifest.from_json(Manifest.of({"shop.t": entry}).to_json())
    back = m.tables["shop.t"]
    assert back.retired_columns == ["gone"] and back.renamed_columns == {"note": "label"}
    assert back.emptied_at == [BinlogOffset("b.000001", 100)] and back.ended_at == BinlogOffset("b.000002", 4)
    assert [c.name for c in back.source_schema.columns] == ["id", "a", "note"]
    assert back.optional_columns == ["gone"] and m.ended_tables() == ["shop.t"]
    assert not m.handoff_filter().emits("shop.t", [1], BinlogOffset("b.000002", 5))
    assert m.handoff_filter().emits("shop.t", [1], BinlogOffset("b.000002", 4))


def test_the_selection_travels_in_the_manifest() -> None:
    chunk = SnapshotChunk("shop.t", 0, (KeyColumn("id", INT),), None, None)
    entry = CapturedTable(OLD, ["id"], [FinishedChunk(chunk, BinlogOffset("b.000001", 4))])
    entry.shadow_of = "shop.orders"
    entry.replaced_from = [(BinlogOffset("b.000003", 9), "shop._t_gho")]
    m = Manifest.of({"shop.t": entry})
    m.selection = CaptureSelection(("shop.*",), ("shop.tmp_*",), ("shop.orders",), True, {"shop.nokey": ["a"]})
    m.refused = {"shop.nokey2": {"offset": {"file": "b.000002", "pos": 4}, "reason": "no key"}}
    back = Manifest.from_json(m.to_json())
    assert back.selection == m.selection and back.refused == m.refused
    assert back.selection.selects("shop.new") and not back.selection.selects("shop.tmp_1")
    assert back.selection.has_changelog("shop.orders") and not back.selection.has_changelog("shop.new")
    assert back.tables["shop.t"].shadow_of == "shop.orders"
    assert back.tables["shop.t"].replaced_from == [(BinlogOffset("b.000003", 9), "shop._t_gho")]
    assert back.merged({}, {}).selection == m.selection  # plan steps keep it
    assert not CaptureSelection().selects("shop.t")  # no selection recorded: nothing is captured by CREATE


def test_changes_after_an_offset_compare_file_then_position() -> None:
    block = pa.table({"file_num": [1, 1, 2, 2, 10], "pos": [500, 900, 4, 300, 4], "seq": [0, 1, 2, 3, 4]})
    assert changes_after(block, (1, 500)).column("seq").to_pylist() == [1, 2, 3, 4]
    assert changes_after(block, (2, 4)).column("seq").to_pylist() == [3, 4]
    assert changes_after(block, (10, 4)).num_rows == 0
