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
