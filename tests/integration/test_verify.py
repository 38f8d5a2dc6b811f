"""``verify`` on a REAL pipeline: MariaDB, a Spark snapshot, the binlog stream and Delta tables.

It must pass while a random writer changes all three tables (the rows in flight are left out of
that comparison, never reported as differences), and find three planted differences afterwards —
one value changed in a Delta row, one row deleted, one extra row — naming the table and the chunk,
through the CLI as a user runs it (exit 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.row_digest import DigestPlan
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.job import StreamOptions, start_stream, stop_gracefully, wait_until_caught_up
from airflow_provider_mysqlcdc.verify import VerifyError, verify_pipeline
from tests.support.mariadb import MariaDBServer
from tests.support.random_writer import RandomWriter, make_tables

pytestmark = pytest.mark.integration

ROWS = 6_000
REPO = Path(__file__).resolve().parents[2]


def _chunk_of(manifest: Any, table: str, key: tuple[Any, ...]) -> int:
    splits = sorted((c.chunk for c in manifest.tables[table].chunks), key=lambda s: s.split_id)
    return ChunkLocator(splits, manifest.collations).index_of(key)


@pytest.mark.timeout(900)
def test_verify_passes_under_writes_and_names_planted_differences(  # type: ignore[no-untyped-def]
    mariadb: MariaDBServer, db: str, cdc_settings, spark, tmp_path: Path
) -> None:
    tables = make_tables(mariadb, db, rows=ROWS)
    mariadb.execute(f"ALTER TABLE `{db}`.t_int ADD COLUMN ratio DOUBLE, ADD COLUMN raw VARBINARY(8), "
                    "ADD COLUMN d DATE, ADD COLUMN flag BIT(1)",
                    f"UPDATE `{db}`.t_int SET ratio = id / 7, raw = UNHEX(HEX(id)), "
                    "d = '2026-01-01' + INTERVAL id DAY, flag = id % 2")  # fmt: skip
    store = StateStore(str(tmp_path / "state"), "vf")
    sink = DeltaSink(str(tmp_path / "lake"))
    writer = RandomWriter(mariadb, db, rows=ROWS)
    writer.start()
    try:
        with cdc_settings.connect() as conn:
            plan = plan_snapshot(conn, tables, 500, 64)  # one group: one Spark job
        store.write_plan("p1", plan.to_dict())
        for g in plan.groups:
            run_snapshot_group(spark, cdc_settings, store, "p1", g.group_id, sink)
        store.write_manifest(build_manifest(plan, store.read_all_results("p1")))
        query = start_stream(spark, cdc_settings, store, sink, StreamOptions(trigger_seconds=0.5, readers=2))
        try:
            time.sleep(3)
            report = verify_pipeline(cdc_settings, store, sink, wait_timeout=120)  # the writer keeps writing
            assert report.ok, report.summary()
            assert writer.transactions > 0 and sum(v.in_flight_keys for v in report.verdicts) > 0, report.to_dict()
            by = {v.table: v for v in report.verdicts}
            assert by[f"{db}.t_int"].unchecked_columns == {"ratio": "DOUBLE text differs between the server and "
                                                                    "Python"}  # fmt: skip
            assert all(v.chunks >= 10 for v in report.verdicts)
            writer.stop_event.set()
            writer.join()
            with cdc_settings.connect() as conn:
                wait_until_caught_up(query, current_offset(conn))
        finally:
            stop_gracefully(query)
    finally:
        writer.stop_event.set()

    clean = verify_pipeline(cdc_settings, store, sink, wait_timeout=30)
    assert clean.ok and sum(v.in_flight_keys for v in clean.verdicts) == 0, clean.summary()
    assert {v.table: v.source_rows for v in clean.verdicts} == {v.table: v.lake_rows for v in clean.verdicts}

    # Plant three differences in the lake, one per table.
    manifest = store.read_manifest()
    t_int = DeltaTable(sink.table_uri(f"{db}.t_int"))
    changed = sink.read(f"{db}.t_int").column("id").to_pylist()[100]
    t_int.update(predicate=f"id = {changed}", updates={"note": "'tampered'"})
    t_comp = DeltaTable(sink.table_uri(f"{db}.t_comp"))
    gone = sink.read(f"{db}.t_comp").select(["region", "n"]).slice(7, 1).to_pylist()[0]
    t_comp.delete(f"region = '{gone['region']}' AND n = {gone['n']}")
    ci = sink.read(f"{db}.t_ci")
    extra = ci.slice(0, 1).to_pylist()[0] | {"k": "zzz-extra"}
    write_deltalake(sink.table_uri(f"{db}.t_ci"), pa.Table.from_pylist([extra], schema=ci.schema), mode="append")
    expected = {
        f"{db}.t_int": [_chunk_of(manifest, f"{db}.t_int", (changed,))],
        f"{db}.t_comp": [_chunk_of(manifest, f"{db}.t_comp", (gone["region"], gone["n"]))],
        f"{db}.t_ci": [_chunk_of(manifest, f"{db}.t_ci", ("zzz-extra",))],
    }
    tampered = verify_pipeline(cdc_settings, store, sink, wait_timeout=30)
    assert not tampered.ok
    assert {v.table: v.differing for v in tampered.verdicts} == expected, tampered.summary()
    rows = {v.table: (v.source_rows, v.lake_rows) for v in tampered.verdicts}
    assert rows[f"{db}.t_int"][0] == rows[f"{db}.t_int"][1]  # a changed value: same count, other digest
    assert rows[f"{db}.t_comp"][1] == rows[f"{db}.t_comp"][0] - 1
    assert rows[f"{db}.t_ci"][1] == rows[f"{db}.t_ci"][0] + 1

    # The CLI says the same, names table and chunk, and exits 1.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__"))}
    env.update(AIRFLOW_HOME=str(tmp_path / "af"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW_CONN_MYSQL_CDC_DEFAULT=mariadb.airflow_conn_json())  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "airflow_provider_mysqlcdc", "verify", "--pipeline", "vf", "--state-root",
         str(tmp_path / "state"), "--sink-root", str(tmp_path / "lake"), "--json", "--wait-timeout", "30"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert {t["table"]: t["differing_chunks"] for t in doc["tables"]} == expected
    assert doc["repair_chunks"] == expected and "repair_chunks=" in out.stderr  # what to trigger the DAG with
    assert f"{db}.t_comp chunk {expected[f'{db}.t_comp'][0]}" in out.stderr and "contents differ" in out.stderr

    # A stream that is not running cannot catch up with new writes: verify says so instead of comparing.
    mariadb.execute(f"UPDATE `{db}`.t_int SET v = v + 1 WHERE id = 1")
    with pytest.raises(VerifyError, match=r"has not applied the source up to .* is it running"):
        verify_pipeline(cdc_settings, store, sink, wait_timeout=1)


def test_digest_plan_covers_what_both_sides_render_alike() -> None:
    from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema

    cols = [ColumnInfo("id", 1, "bigint", "bigint(20)", False), ColumnInfo("f", 2, "float", "float", True),
            ColumnInfo("g", 3, "point", "point", True), ColumnInfo("s", 4, "varchar", "varchar(9)", True)]  # fmt: skip
    plan = DigestPlan.of(TableSchema(TableId("d", "t"), cols, ["id"]))
    assert [c.name for c in plan.checked] == ["id", "s"] and set(plan.unchecked) == {"f", "g"}
    assert "MD5(CONCAT_WS(" in plan.sql_row_digest()
