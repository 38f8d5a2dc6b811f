"""The test infrastructure itself: the S3 server fixture and the standalone Spark cluster fixture.

* concurrent Delta commits on the S3 server lose nothing (moto honours ``If-None-Match: *``,
  delta-rs commits with ``conditional_put=etag``);
* an application submitted to the cluster runs Python tasks with the venv (the provider and
  pyarrow import) that write Parquet to S3 through s3fs, read back by the driver;
* killing an executor JVM mid-job: Spark reschedules the lost task and the result stays exact;
  the S3 secret shows up in no process argv, the app's environment page nor its event log.

Applications go through ``spark-submit`` subprocesses: the test process may already hold the
session-wide local ``spark`` fixture, and one process cannot have two SparkContexts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support import cluster_jobs
from tests.support.mariadb import free_port
from tests.support.s3_server import S3Server
from tests.support.secret_scan import scan_directory, scan_processes, scan_spark_environment
from tests.support.spark_cluster import SparkCluster

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _submit(
    cluster: SparkCluster, job: str, cfg: dict[str, Any], result: Path, conf: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = cluster.submit_env()
    env["CLUSTER_JOB_CONFIG"] = json.dumps(cfg)  # the secret travels in the environment, not argv
    with open(result.with_suffix(".log"), "wb") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            cluster.spark_submit_cmd(cluster_jobs.__file__, job, str(result), conf=conf),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _finish(proc: subprocess.Popen[bytes], result: Path, timeout: float) -> dict[str, Any]:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = None
    log_tail = result.with_suffix(".log").read_text(errors="replace")[-4000:]
    assert rc == 0 and result.exists(), f"spark-submit ended with {rc}:\n{log_tail}"
    return json.loads(result.read_text())


def test_concurrent_delta_appends_on_s3_lose_nothing(s3_server: S3Server) -> None:
    from deltalake import DeltaTable, write_deltalake

    url = s3_server.url(f"concurrent-{time.monotonic_ns()}")
    opts = s3_server.storage_options()
    first = pa.table({"w": pa.array([-1], pa.int32()), "i": pa.array([0], pa.int64())})
    write_deltalake(url, first, storage_options=opts)

    writers, rounds, rows = 2, 3, 100
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def append(w: int) -> None:
        try:
            for r in range(rounds):
                ids = pa.array(range(r * rows, (r + 1) * rows), pa.int64())
                batch = pa.table({"w": pa.array([w] * rows, pa.int32()), "i": ids})
                barrier.wait(timeout=30)  # every round's commits start at the same moment
                write_deltalake(url, batch, mode="append", storage_options=opts)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=append, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors

    table = DeltaTable(url, storage_options=opts)
    commits = writers * rounds
    assert table.version() == commits
    data = table.to_pyarrow_table()
    assert data.num_rows == 1 + commits * rows
    per_writer = {w: data.filter(pa.compute.equal(data["w"], w)).num_rows for w in range(writers)}
    assert per_writer == {w: rounds * rows for w in range(writers)}

    log_files = sorted(Path(p).name for p in s3_server.fsspec().ls(f"{url.removeprefix('s3://')}/_delta_log"))
    versions = [int(n.split(".")[0]) for n in log_files if n.endswith(".json")]
    assert versions == list(range(commits + 1)), log_files


def test_cluster_tasks_import_the_provider_and_write_parquet_to_s3(
    spark_cluster: SparkCluster, s3_server: S3Server, tmp_path: Path
) -> None:
    import sys

    parts, rows = 4, 500
    cfg = {"s3": s3_server.endpoint.as_dict(), "prefix": f"cluster-write-{time.monotonic_ns()}",
           "partitions": parts, "rows_per_partition": rows}
    out = _finish(_submit(spark_cluster, "write", cfg, tmp_path / "write.json"), tmp_path / "write.json", 120)

    assert sorted(w["partition"] for w in out["written"]) == list(range(parts))
    assert {w["python"] for w in out["written"]} == {sys.executable}
    assert all(w["provider"].startswith(str(Path(__file__).resolve().parents[2])) for w in out["written"])
    assert out["read_rows"] == parts * rows
    assert out["read_id_sum"] == sum(range(parts * rows))
    assert out["read_parts"] == list(range(parts))
    names = s3_server.fsspec().ls(f"{s3_server.bucket}/{cfg['prefix']}")
    assert len(names) == parts, names
    # the application really ran on the cluster's executors and logged its events
    assert spark_cluster.event_log_files(out["app_id"]), list(spark_cluster.event_log_dir.rglob("*"))


def test_killing_an_executor_mid_job_reschedules_and_the_result_is_exact(
    spark_cluster: SparkCluster, s3_server: S3Server, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    parts, n = 2, 10_000  # one task per executor: the killed one's task must run again
    # the S3 config rides along only to prove it never leaks (argv, environment page, event log)
    cfg = {"marker_dir": str(markers), "hold_seconds": 60, "partitions": parts, "n": n,
           "s3": s3_server.endpoint.as_dict()}
    ui_port = free_port()
    result = tmp_path / "slow.json"
    proc = _submit(spark_cluster, "slow", cfg, result, conf={"spark.ui.port": str(ui_port)})
    try:
        deadline = time.monotonic() + 60
        while len(list(markers.iterdir())) < 2:  # one task held on each executor
            assert proc.poll() is None, result.with_suffix(".log").read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "no two tasks started within 60 s"
            time.sleep(0.1)
        (app_id,) = spark_cluster.active_app_ids()
        executors = spark_cluster.executor_pids(app_id)
        assert len(executors) == 2, executors

        secret = s3_server.secret_access_key
        assert scan_processes([secret]) == []
        assert scan_spark_environment([secret], f"http://127.0.0.1:{ui_port}") == []

        os.kill(executors[0], signal.SIGKILL)
        (markers / "release").touch()  # the surviving task may finish; the killed one must run again
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    out = _finish(proc, result, 120)
    assert out["app_id"] == app_id

    results = sorted(out["results"], key=lambda r: r["partition"])
    assert [r["partition"] for r in results] == list(range(parts))
    assert sum(r["count"] for r in results) == n
    assert sum(r["sum"] for r in results) == sum(range(n))
    assert any(r["attempt"] >= 1 for r in results), results  # the killed executor's task ran again

    text = "".join(p.read_text(errors="replace") for p in spark_cluster.event_log_files(out["app_id"]))
    assert "ExecutorLostFailure" in text or "SparkListenerExecutorRemoved" in text
    assert scan_directory([s3_server.secret_access_key], spark_cluster.event_log_dir) == []
