"""The spark-submit entry point: a group killed (-9) midway and run again leaves exactly the source rows."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore

REPO = Path(__file__).resolve().parents[2]
ROWS = 300_000


def _submit(tmp_path: Path, cdc_settings, group: int = 0, reader: str = "auto") -> subprocess.Popen:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    env["MYSQLCDC_SOURCE"] = json.dumps(cdc_settings.to_dict())
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    cmd = [
        spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
        "--jars", "/usr/share/java/mariadb-java-client.jar",
        str(REPO / "spark_jobs" / "snapshot.py"),
        "--state-root", str(tmp_path / "state"), "--pipeline-id", "pipe", "--plan-id", "p1",
        "--group-id", str(group), "--sink-root", str(tmp_path / "lake"), "--reader", reader,
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


@pytest.mark.parametrize("reader", ["native", "jdbc"])
def test_killed_job_rerun_has_exact_rows(reader: str, mariadb, db, cdc_settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = f"{db}.big"
    mariadb.execute(
        f"CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(100))",
        f"INSERT INTO {table} SELECT seq, seq, RPAD('x', 90, 'y') FROM seq_1_to_{ROWS}",
        database=db,
    )
    store = StateStore(str(tmp_path / "state"), "pipe")
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, [table], 30_000, 64)
    store.write_plan("p1", plan.to_dict())
    assert len(plan.groups) == 1 and len(plan.splits) >= 10

    proc = _submit(tmp_path, cdc_settings, reader=reader)
    # Kill as soon as the first chunk is being written (JDBC: Spark's _temporary; native: a part file).
    attempt_dir = tmp_path / "lake" / db / "big" / "snapshot" / "p1-g00000" / "*"
    deadline = time.monotonic() + 180
    while not (glob.glob(str(attempt_dir / "_temporary")) or glob.glob(str(attempt_dir / "part-*"))):
        assert proc.poll() is None, [ln for ln in proc.stderr.read().decode().splitlines() if "INFO" not in ln][-40:]
        assert time.monotonic() < deadline, "the job never started writing"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    sink = DeltaSink(str(tmp_path / "lake"))
    visible = sink.read(table).num_rows if sink.exists(table) else 0
    assert visible == 0, "a killed job must leave nothing visible"
    assert store.read_group_report("p1", 0) is None

    mariadb.execute(f"UPDATE {table} SET v = -1 WHERE id % 1000 = 0")  # the source moves on meanwhile
    proc = _submit(tmp_path, cdc_settings, reader=reader)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    line = next(ln for ln in out.decode().splitlines() if ln.startswith("MYSQLCDC_RESULT "))
    summary = json.loads(line.split(" ", 1)[1])
    assert summary["rows"] == ROWS

    t = sink.read(table)
    ids = t.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == ROWS
    got = dict(zip(ids, t.column("v").to_pylist(), strict=True))
    src = dict(mariadb.query(f"SELECT id, v FROM {table}"))
    assert got == src
    assert sum(r.rows for r in store.read_all_results("p1")) == ROWS


def test_job_reports_clear_error_and_exit_code(mariadb, db, cdc_settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = f"{db}.gone"
    mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)", f"INSERT INTO {table} VALUES (1), (2)")
    store = StateStore(str(tmp_path / "state"), "pipe")
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, [table], 10, 64)
    store.write_plan("p1", plan.to_dict())
    mariadb.execute(f"DROP TABLE {table}")
    proc = _submit(tmp_path, cdc_settings)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1
    assert "does not exist" in out.decode() + err.decode()
