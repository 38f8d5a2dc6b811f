"""Any identifier MySQL accepts: databases and tables whose names hold a dot, a backtick or a space.

Selected by a pattern and by their exact (backtick-quoted) names, snapshotted while a writer runs,
streamed from the minimum high watermark: every Delta table equals its source, under the name the
plan, the manifest and the logs give it (``core/table.TableId``: ``shop.`order.items```).
"""

from __future__ import annotations

import time

import pytest

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.core.table_selection import TableSelection
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.mysql.table_choice import choose_tables
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.job import StreamOptions, start_stream, stop_gracefully, wait_until_caught_up
from tests.integration.test_stream_e2e import assert_sink_equals_source

pytestmark = pytest.mark.integration

NAMES = [("order.items", "BIGINT"), ("we`ird", "VARCHAR(20)"), ("my table", "INT"), ("Ünïcødé", "BIGINT")]


def test_tables_named_with_dots_backticks_and_spaces_are_captured_exactly(  # type: ignore[no-untyped-def]
    mariadb, db, cdc_settings, spark, tmp_path
) -> None:
    dotted_db = f"{db}.dot"
    mariadb.execute(f"CREATE DATABASE `{dotted_db}`")
    try:
        tables = []
        for name, key in NAMES:
            tid = TableId(db, name)
            mariadb.execute(f"CREATE TABLE {tid.quoted} (id {key} NOT NULL PRIMARY KEY, v INT NOT NULL)",
                            f"INSERT INTO {tid.quoted} SELECT seq, seq FROM seq_1_to_400", database=db)  # fmt: skip
            tables.append(str(tid))
        other = TableId(dotted_db, "t")
        mariadb.execute(f"CREATE TABLE {other.quoted} (id INT NOT NULL PRIMARY KEY, v INT NOT NULL)",
                        f"INSERT INTO {other.quoted} SELECT seq, seq FROM seq_1_to_400", database=db)  # fmt: skip
        assert tables[0] == f"{db}.`order.items`" and tables[1] == f"{db}.`we``ird`" and str(other) == f"`{db}.dot`.t"

        with cdc_settings.connect() as conn:
            choice = choose_tables(conn, TableSelection.parse([f"{db}.*", str(other)], []))
            assert sorted(choice.tables) == sorted([*tables, str(other)]), choice.to_dict()
            plan = plan_snapshot(conn, choice.tables, 100, 4)
        assert sorted(plan.tables) == sorted(choice.tables)
        store = StateStore(str(tmp_path / "state"), "names")
        sink = DeltaSink(str(tmp_path / "lake"))
        store.write_plan("p1", plan.to_dict())
        for g in plan.groups:
            run_snapshot_group(spark, cdc_settings, store, "p1", g.group_id, sink)
        store.write_manifest(build_manifest(plan, store.read_all_results("p1")))
        query = start_stream(spark, cdc_settings, store, sink, StreamOptions(trigger_seconds=0.5))
        try:
            for tid in [TableId.parse(t) for t in choice.tables]:  # changes through the binlog, by name
                mariadb.execute(f"UPDATE {tid.quoted} SET v = v + 1 WHERE id <= 50",
                                f"DELETE FROM {tid.quoted} WHERE id BETWEEN 300 AND 320",
                                f"INSERT INTO {tid.quoted} VALUES (1000, 7)")  # fmt: skip
            time.sleep(1)
            with cdc_settings.connect() as conn:
                target = current_offset(conn)
            wait_until_caught_up(query, target)
        finally:
            stop_gracefully(query)
        assert_sink_equals_source(cdc_settings, plan, sink, choice.tables)
        assert (tmp_path / "lake" / db / "order.items" / "_delta_log").is_dir()
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS `{dotted_db}`")
