"""The value an ADD COLUMN gives existing rows, as mysql/column_defaults.py reads it, equals what the
server put in those rows, canonical (read back with the snapshot's projection), for every kind of
column and default: literals of each type, DEFAULT NULL, and NOT NULL columns without a default
(the type's implicit value). Expression defaults are reported, not guessed."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.canonical_json import from_json, to_json
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.column_defaults import added_column_values, is_literal_default
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from tests.support.verify import source_table

ADDED = [
    "i_neg INT NOT NULL DEFAULT -5", "u64 BIGINT UNSIGNED DEFAULT 18446744073709551615",
    "dec2 DECIMAL(10,2) DEFAULT 1.5", "dec50 DECIMAL(50,10) DEFAULT -3.25", "f FLOAT DEFAULT 1.1",
    "d DOUBLE DEFAULT 2.5e10", "y YEAR DEFAULT 2001", "s VARCHAR(20) DEFAULT 'it''s \\\\ x'",
    "lat VARCHAR(5) CHARACTER SET latin1 DEFAULT 'é€'", "empty VARCHAR(3) DEFAULT ''",
    "word CHAR(4) DEFAULT 'NULL'", "bin BINARY(4) DEFAULT 'ab'", "vbin VARBINARY(4) DEFAULT x'00ff'",
    "e ENUM('x','y') DEFAULT 'y'", "st SET('p','q') DEFAULT 'q,p'", "b1 BIT(1) DEFAULT 1",
    "b5 BIT(5) DEFAULT b'101'", "b64 BIT(64) DEFAULT b'1111'", "dt DATE DEFAULT '2020-02-29'",
    "dtm DATETIME(3) DEFAULT '2020-02-03 04:05:06.789'", "ts TIMESTAMP(2) NULL DEFAULT '2021-01-01 00:00:00.25'",
    "tm TIME(2) DEFAULT '-01:02:03.5'", "n_null INT DEFAULT NULL", "n_plain VARCHAR(3)",
    # NOT NULL without a default: the type's implicit value
    "nn_int INT NOT NULL", "nn_txt TEXT NOT NULL", "nn_enum ENUM('first','second') NOT NULL",
    "nn_set SET('a') NOT NULL", "nn_bit BIT(1) NOT NULL", "nn_bin BINARY(3) NOT NULL", "nn_date DATE NOT NULL",
    "nn_ts TIMESTAMP NOT NULL", "nn_time TIME NOT NULL", "nn_dec DECIMAL(6,3) NOT NULL",
    "js JSON DEFAULT '{\"a\": 1}'",
]  # fmt: skip


def test_added_column_values_equal_what_the_server_gave_existing_rows(mariadb: Any, db: str, cdc_conn: Any) -> None:
    mariadb.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1), (2, 2)", database=db)
    mariadb.execute("ALTER TABLE t " + ", ".join(f"ADD COLUMN {c}" for c in ADDED), database=db)
    mariadb.execute("ALTER TABLE t ADD COLUMN made TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
                    "ADD COLUMN tag VARCHAR(40) DEFAULT (uuid())", database=db)  # fmt: skip
    schema = read_table_schema(cdc_conn, TableId.parse(f"{db}.t"))
    names = [c.name for c in schema.columns if c.name not in ("id", "v")]
    values, expressions = added_column_values(cdc_conn, schema, names)

    assert set(expressions) == {"made", "tag"} and "current_timestamp" in expressions["made"].lower()
    assert set(values) == set(names) - {"made", "tag"}
    truth = source_table(cdc_conn, schema).to_pylist()
    assert truth[0]["tag"] != truth[1]["tag"]  # an expression is evaluated per row: no one value to know
    assert truth[0] == truth[1] | {"id": 1, "v": 1, "tag": truth[0]["tag"]}  # a literal: the same in every row
    for name, value in values.items():
        assert value == truth[0][name], (name, value, truth[0][name])
        # the value goes through Arrow (the decoder's blocks) and JSON (the manifest) unchanged
        arrow = pa.array([value], cdc_types.arrow_schema(schema).field(name).type).to_pylist()[0]
        assert arrow == truth[0][name] and from_json(to_json(value)) == value, name
    assert values["n_plain"] is None and values["nn_date"] is None and values["nn_enum"] == "first"
    assert values["vbin"] == b"\x00\xff" and values["bin"] == b"ab\x00\x00" and values["s"] == "it's \\ x"


def test_an_empty_table_gives_the_defaults_it_can_read(mariadb: Any, db: str, cdc_conn: Any) -> None:
    """The server reads a NOT NULL column's default only from a row; an empty table has no row to fill."""
    mariadb.execute("CREATE TABLE e (id INT PRIMARY KEY)", "ALTER TABLE e ADD COLUMN a INT NOT NULL DEFAULT 4, "
                    "ADD COLUMN b VARCHAR(3) DEFAULT 'x', ADD COLUMN c INT NOT NULL", database=db)  # fmt: skip
    schema = read_table_schema(cdc_conn, TableId.parse(f"{db}.e"))
    assert added_column_values(cdc_conn, schema, ["a", "b", "c"]) == ({"b": "x", "c": 0}, {})


def test_literal_and_expression_defaults_as_each_server_writes_them() -> None:
    """MariaDB quotes literals and leaves expressions bare; MySQL 8 leaves both bare and marks
    expressions DEFAULT_GENERATED (no MySQL 8 server here: its documented forms)."""
    for text in ("'web'", "'it''s'", "-5", "1.50", "2.5e10", "b'101'", "''"):
        assert is_literal_default(text, "", mariadb=True), text
    for text in ("current_timestamp()", "current_timestamp(6)", "uuid()", "(1 + 1)", "curdate()"):
        assert not is_literal_default(text, "", mariadb=True), text
    assert is_literal_default("web", "", mariadb=False) and is_literal_default("0", "", mariadb=False)
    assert not is_literal_default("CURRENT_TIMESTAMP", "DEFAULT_GENERATED", mariadb=False)
    assert not is_literal_default("(uuid())", "DEFAULT_GENERATED on update CURRENT_TIMESTAMP", mariadb=False)
