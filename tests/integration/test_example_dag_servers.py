"""The example DAG on MySQL 9.7 and MariaDB 11.8, as the issue's user ran it (issue 34, acceptance 1).

The DAG captures two kinds of table. One is keyed by a VARCHAR in the server's **default**
collation: ``DEFAULT CHARSET=utf8mb4`` and no collation named, so ``utf8mb4_0900_ai_ci`` on MySQL
and ``utf8mb4_uca1400_ai_ci`` on MariaDB 11. Its values differ by accents, case, trailing spaces
and emoji. The others are the random writer's tricky-key tables. ``source_conn_id`` points the
whole run at the server. Writers insert, update, delete and move keys while the plan, the mapped
snapshot tasks and the detached stream run. After catch-up every table equals its source row for
row.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import request_stop, wait_until_applied
from tests.integration.test_collation_keys import _value, _variant, _VariantWriter
from tests.support.airflow_env import load_dag, run_dag
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.verify import compare

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROWS = 3_000


def _default_collation_table(server: Any, db: str) -> str:
    server.execute(f"CREATE TABLE `{db}`.k0 (k VARCHAR(40) PRIMARY KEY, v INT NOT NULL) DEFAULT CHARSET=utf8mb4")
    rng = random.Random(34)
    values = [_value(rng) for _ in range(ROWS)]
    values += [_variant(rng, v) for v in values[: ROWS // 3]]
    with server.root_connection(db) as conn, conn.cursor() as cur:
        cur.executemany("INSERT IGNORE INTO k0 VALUES (%s, %s)", [(v, n) for n, v in enumerate(values)])
    return f"{db}.k0"


@pytest.mark.parametrize("flavour", ["mysql97", "mariadb118"])
def test_the_example_dag_captures_default_collation_keys_exactly(  # type: ignore[no-untyped-def]
    flavour, airflow_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request
) -> None:
    server = request.getfixturevalue(flavour)
    db = "dag_" + uuid.uuid4().hex[:8]
    server.execute(f"CREATE DATABASE {db}")
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_CDC_SERVER", server.airflow_conn_json())
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    pipeline = "srv" + flavour
    conf = {"pipeline_id": pipeline, "source_conn_id": "mysql_cdc_server", "sink_root": str(tmp_path / "lake"),
            "state_root": str(tmp_path / "state"), "chunk_size": 1_000, "chunks_per_task": 8}  # fmt: skip
    store, settings = StateStore(conf["state_root"], pipeline), server.cdc_settings()
    try:
        tables = [_default_collation_table(server, db), *make_tables(server, db, rows=ROWS)]
        with server.root_connection(db) as conn, conn.cursor() as cur:
            cur.execute("SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_NAME = 'k0' AND COLUMN_NAME = 'k'", (db,))  # fmt: skip
            assert cur.fetchone()[0] == server.flavour.default_collation
        writers = [_VariantWriter(server, db, 1), RandomWriter(server, db, rate=100, rows=ROWS)]
        for w in writers:
            w.start()
        try:
            run = run_dag(load_dag("mysql_cdc"), {**conf, "tables": tables})
            assert run.state == "success", run.task_states
            assert len(run.xcom("plan")) >= 2  # mapped snapshot tasks
            time.sleep(2)
        finally:
            for w in writers:
                w.stop_event.set()
                w.join()
        assert all(w.transactions > 100 for w in writers), [w.transactions for w in writers]
        with settings.connect() as conn:
            wait_until_applied(store, current_offset(conn), timeout=240)
            sink = DeltaSink(conf["sink_root"])
            for t in tables:
                cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
                assert cmp.match, f"{t}: {cmp.first_difference}"
    finally:
        request_stop(store, timeout=60)
        server.execute(f"DROP DATABASE IF EXISTS {db}")
        os.environ.pop("AIRFLOW_CONN_MYSQL_CDC_SERVER", None)
