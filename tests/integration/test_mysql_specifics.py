"""What only MySQL has, snapshotted and streamed exactly on MySQL 9.7 (issue 34, item 3).

- **Generated invisible primary keys** (``sql_generate_invisible_primary_key=ON``, the default on
  some managed services): a table created without a key gets a hidden ``my_row_id``. ``SELECT *``
  leaves it out, but it is the table's primary key, so it is the chunk key and travels to the lake.
- **Fractional seconds** of ``DATETIME(6)`` / ``TIMESTAMP(3)`` / ``TIME(4)``.

A writer updates, inserts and deletes while the stream runs, and every table ends equal to its
source. The binlog settings this provider cannot decode exactly are refused by ``check``, naming
the setting: compressed transaction payloads, and partial JSON updates.
"""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.checks import check_source
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.job import StreamOptions
from tests.integration.test_stream_e2e import assert_sink_equals_source
from tests.support.pipeline_runs import snapshot_tables, stream_to_catch_up
from tests.support.random_writer import numbers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROWS = 600


def _tables(server: Any, db: str) -> list[str]:
    seq = numbers(ROWS)
    server.execute(
        "SET SESSION sql_generate_invisible_primary_key = ON",
        f"CREATE TABLE `{db}`.gipk (name VARCHAR(40) NOT NULL, v INT NOT NULL)",
        "SET SESSION sql_generate_invisible_primary_key = OFF",
        f"INSERT INTO `{db}`.gipk (name, v) SELECT CONCAT('n', seq), seq FROM {seq} AS s",
        f"CREATE TABLE `{db}`.docs (id INT NOT NULL PRIMARY KEY, doc VARCHAR(20), at DATETIME(6), "
        "ts TIMESTAMP(3) NULL, t TIME(4))",
        database=db,
    )
    with server.root_connection(db) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO docs VALUES (%s, %s, %s, %s, %s)",
            [(i, f"d{i}", f"2026-01-02 03:04:05.{i:06d}", f"2026-01-02 03:04:05.{i % 1000:03d}",
              f"-12:34:56.{i % 10000:04d}") for i in range(1, ROWS + 1)],
        )  # fmt: skip
    return [f"{db}.gipk", f"{db}.docs"]


class _Writer(threading.Thread):
    def __init__(self, server: Any, db: str):
        super().__init__(daemon=True)
        self.server, self.db = server, db
        self.stop_event = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        rng = random.Random(3)
        with self.server.root_connection(self.db) as conn, conn.cursor() as cur:
            while not self.stop_event.is_set():
                i, r = rng.randint(1, ROWS + 100), rng.random()
                if r < 0.3:
                    cur.execute("UPDATE docs SET doc = CONCAT(doc, 'u'), at = NOW(6), t = '838:59:59.0000' "
                                "WHERE id = %s", (i,))  # fmt: skip
                elif r < 0.5:
                    cur.execute("INSERT IGNORE INTO docs VALUES (%s, 'w', NOW(6), NOW(3), '00:00:00.0001')", (i,))
                elif r < 0.6:
                    cur.execute("DELETE FROM docs WHERE id = %s", (i,))
                elif r < 0.8:
                    cur.execute("UPDATE gipk SET v = v + 1, name = CONCAT(name, 'x') WHERE v = %s", (i,))
                elif r < 0.9:
                    cur.execute("INSERT INTO gipk (name, v) VALUES (%s, %s)", (f"w{i}", -i))
                else:
                    cur.execute("DELETE FROM gipk WHERE v = %s", (i,))
                self.transactions += 1
                self.stop_event.wait(0.005)


def test_gipk_and_fractions_snapshot_and_stream_exactly(mysql97, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = "my_" + uuid.uuid4().hex[:8]
    mysql97.execute(f"CREATE DATABASE {db}")
    settings = mysql97.cdc_settings()
    try:
        tables = _tables(mysql97, db)
        with settings.connect() as conn:
            gipk = read_table_schema(conn, TableId.parse(tables[0]))
            report = check_source(conn, tables)
        assert gipk.primary_key == ["my_row_id"] and "my_row_id" in [c.name for c in gipk.columns]
        assert report.ok and report.tables == tables, report.summary()
        store, sink = StateStore(str(tmp_path / "state"), "my"), DeltaSink(str(tmp_path / "lake"))
        writer = _Writer(mysql97, db)
        writer.start()
        try:
            plan = snapshot_tables(spark, settings, store, sink, tables, 100, 4)
            stream_to_catch_up(spark, settings, store, sink, StreamOptions(trigger_seconds=0.5), [writer], 3)
        finally:
            writer.stop_event.set()
        assert writer.transactions > 100
        assert "my_row_id" in sink.read(tables[0]).schema.names  # the hidden key travels to the lake
        assert_sink_equals_source(settings, plan, sink, tables)
    finally:
        mysql97.execute(f"DROP DATABASE IF EXISTS {db}")


@pytest.mark.parametrize(("setting", "value"), [("binlog_transaction_compression", "ON"),
                                                ("binlog_row_value_options", "PARTIAL_JSON")])  # fmt: skip
def test_binlog_settings_that_cannot_be_decoded_exactly_are_refused_naming_them(mysql97, setting, value) -> None:  # type: ignore[no-untyped-def]
    mysql97.execute(f"SET GLOBAL {setting} = '{value}'")
    try:
        with mysql97.cdc_settings().connect() as conn:
            report = check_source(conn, [])
        assert not report.ok and any(p.code == setting and setting in p.message for p in report.problems), (
            report.summary())  # fmt: skip
    finally:
        mysql97.execute(f"SET GLOBAL {setting} = DEFAULT")
