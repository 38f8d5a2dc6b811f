"""Where a table went since an offset, from the binlog's statements (real MariaDB)."""

from __future__ import annotations

from typing import Any

from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.mysql.table_moves import name_now


def test_name_now_follows_renames_and_sees_drops(mariadb: Any, db: str, cdc_settings: Any) -> None:
    mariadb.execute("CREATE TABLE a (id INT PRIMARY KEY)", "CREATE TABLE keep (id INT PRIMARY KEY)",
                    "CREATE TABLE gone (id INT PRIMARY KEY)", database=db)  # fmt: skip
    with cdc_settings.connect() as conn:
        since = current_offset(conn)
    mariadb.execute(
        "INSERT INTO a VALUES (1)",
        "RENAME TABLE a TO b, keep TO keep2, keep2 TO keep",  # keep moves and comes back in one statement
        f"ALTER TABLE `{db}`.b ADD COLUMN c INT, RENAME TO c",
        "CREATE TABLE _x_gho LIKE c",
        "RENAME TABLE c TO _c_del, _x_gho TO c",  # a swap: the old c moved on, a new table is c
        "RENAME TABLE gone TO gone2",
        "DROP TABLE gone2",
        database=db,
    )
    assert name_now(cdc_settings, f"{db}.a", since) == f"{db}._c_del"
    assert name_now(cdc_settings, f"{db}.keep", since) == f"{db}.keep"
    assert name_now(cdc_settings, f"{db}._x_gho", since) == f"{db}.c"
    assert name_now(cdc_settings, f"{db}.gone", since) is None
    with cdc_settings.connect() as conn:
        later = current_offset(conn)
    assert name_now(cdc_settings, f"{db}.a", later) == f"{db}.a"  # nothing logged since: as it was
