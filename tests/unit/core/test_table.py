"""A table's chunk key: the primary key, or configured columns that say what they must be."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.core.table import ColumnInfo, SourceSchemaError, TableId, TableSchema

KEYLESS = TableSchema(TableId("shop", "events"), [ColumnInfo("event_id", 1, "bigint", "bigint(20)", False),
                                                  ColumnInfo("note", 2, "varchar", "varchar(20)", True)])  # fmt: skip


def test_a_keyless_table_says_what_a_chunk_key_must_be() -> None:
    with pytest.raises(SourceSchemaError) as exc:
        KEYLESS.chunk_key()
    msg = str(exc.value)
    assert msg.startswith("table shop.events has no primary key: give it a chunk key, NOT NULL columns covered by a "
                          "UNIQUE index")  # fmt: skip
    assert "chunk_key_columns={'shop.events': ['<column>']}" in msg and msg.endswith("or add a primary key")
    assert [k.name for k in KEYLESS.chunk_key(["event_id"])] == ["event_id"]
    with pytest.raises(SourceSchemaError, match="nullable"):
        KEYLESS.chunk_key(["note"])


@pytest.mark.parametrize(
    ("text", "database", "table"),
    [
        ("shop.orders", "shop", "orders"),
        ("`shop`.`orders`", "shop", "orders"),
        ("shop.`order.items`", "shop", "order.items"),
        ("`my.db`.`a.b`", "my.db", "a.b"),
        ("`a``b`.t", "a`b", "t"),
        ("shop.my table", "shop", "my table"),
        ("shop.` edge `", "shop", " edge "),
    ],
)
def test_any_identifier_mysql_accepts_round_trips_through_its_text(text: str, database: str, table: str) -> None:
    """A part holding a dot, a backtick or edge spaces is written in backticks, as in SQL; the
    canonical text (manifest keys, logs) parses back to the same table (issue 34)."""
    tid = TableId.parse(text)
    assert (tid.database, tid.table) == (database, table)
    assert TableId.parse(str(tid)) == tid
    assert tid.quoted == "`" + database.replace("`", "``") + "`.`" + table.replace("`", "``") + "`"


@pytest.mark.parametrize("text", ["orders", "a.b.c", "a.`b", ".b", "a.", "a`b.c", "`a`x.b"])
def test_a_name_that_is_not_db_table_is_refused_with_how_to_write_it(text: str) -> None:
    with pytest.raises(SourceSchemaError, match="in backticks as in SQL"):
        TableId.parse(text)


def test_a_lake_path_escapes_only_what_a_directory_name_cannot_hold() -> None:
    assert TableId("shop", "order.items").path == "shop/order.items"
    assert TableId("shop", "a/b\\c").path == "shop/a%2Fb%5Cc"
    assert TableId("shop", "orders").path == "shop/orders"
