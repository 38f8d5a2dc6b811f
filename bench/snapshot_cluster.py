"""Snapshot throughput on a Spark standalone cluster with the lake on S3, beside the local figure.

    .venv/bin/python bench/snapshot_cluster.py [--rows 1000000] [--chunk-size 62500] [--chunks-per-group 8] [--rounds 3]

Starts a private MariaDB, moto's S3 server and a Spark standalone master with two 1-core workers
(the test fixtures in ``tests/support``: the same 2 cores as ``local[2]``), loads the table of
``bench/snapshot.py``, then runs interleaved rounds of:

* ``local``: the plan's snapshot groups in a ``local[2]`` session into Delta on the local disk;
* ``cluster_s3``: the same groups in a session on the cluster (driver here, executors on the two
  workers) with the Delta lake and the state store on the S3 server — every file written from
  the executors' Python, no S3 connector in the JVM;
* ``spark_jdbc``: the plain Spark JDBC read to local Parquet on ``local[2]`` (the reference of
  ``bench/snapshot.py``).

Each measurement runs in its own Python process (one Spark context per process), warms up with
the same small JDBC read on every side, and times the snapshot alone, not the JVM start. No
concurrent writer: this measures where the files go; the bracket itself is ``bench/snapshot.py``'s.
Reports medians (``*_rows_per_s``) and the ratios of medians to the plain read and to the local
snapshot; one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

log = logging.getLogger("bench.snapshot_cluster")
CONF_ENV = "BENCH_SNAPSHOT_CLUSTER"  # the measurement's settings (with secrets): environment, not argv
TABLE = "bench.orders"


def measure(kind: str, conf: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this process: ``local``, ``cluster_s3`` or ``spark_jdbc``."""
    from airflow_provider_mysqlcdc.mysql import jdbc as mysql_jdbc
    from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
    from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
    from airflow_provider_mysqlcdc.spark_session import build_spark_session
    from airflow_provider_mysqlcdc.state import StateStore
    from airflow_provider_mysqlcdc.storage import LakeStorage

    settings = ConnectionSettings.from_dict(conf["source"])
    cluster = kind == "cluster_s3"
    extra = {"spark.pyspark.python": sys.executable, "spark.cores.max": "2"} if cluster else {}
    spark = build_spark_session(f"bench-{kind}", master=conf["master"] if cluster else "local[2]", extra_conf=extra)
    try:
        # The same untimed warm-up on every side: executors registered, the JDBC and Parquet paths
        # compiled by the JIT (the first read of a fresh JVM is several times slower).
        props = {**mysql_jdbc.jdbc_properties(settings), "fetchsize": "10000"}
        eighth = conf["rows"] // 8
        warm = spark.read.jdbc(mysql_jdbc.jdbc_url(settings), TABLE, column="id", lowerBound=1, upperBound=eighth,
                               numPartitions=2, properties=props)  # fmt: skip
        warm.where(f"id <= {eighth}").write.mode("overwrite").parquet(conf["work"] + "/warmup")
        if kind == "spark_jdbc":
            t0 = time.monotonic()
            df = spark.read.jdbc(mysql_jdbc.jdbc_url(settings), TABLE, column="id", lowerBound=1,
                                 upperBound=conf["rows"], numPartitions=8, properties=props)  # fmt: skip
            df.write.mode("overwrite").parquet(conf["work"] + "/plain")
            return {"seconds": time.monotonic() - t0, "rows": conf["rows"]}
        storage = LakeStorage(conf["s3"]) if cluster else LakeStorage()
        root = conf["s3_root"] if cluster else conf["work"]
        store = StateStore(f"{root}/state", "bench", storage)
        sink = DeltaSink(f"{root}/lake", storage)
        with settings.connect() as conn:
            plan = plan_snapshot(conn, [TABLE], conf["chunk_size"], conf["chunks_per_group"])
        store.write_plan("p1", plan.to_dict())
        t0 = time.monotonic()
        results = [run_snapshot_group(spark, settings, store, "p1", g.group_id, sink) for g in plan.groups]
        seconds = time.monotonic() - t0
        rows = sum(r.rows for r in results)
        delta_rows = sink.read(TABLE).num_rows
        if delta_rows != rows:
            raise SystemExit(f"{kind}: Delta holds {delta_rows} rows, the snapshot reported {rows}")
        return {"seconds": seconds, "rows": rows, "groups": len(plan.groups), "chunks": len(plan.splits)}
    finally:
        spark.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--chunk-size", type=int, default=62_500)
    p.add_argument("--chunks-per-group", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--measure", choices=("local", "cluster_s3", "spark_jdbc"), help=argparse.SUPPRESS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    if args.measure:  # a child process: one measurement, one JSON line
        print("BENCH_RESULT " + json.dumps(measure(args.measure, json.loads(os.environ[CONF_ENV]))), flush=True)
        return 0

    from tests.support.bench_data import load_orders
    from tests.support.mariadb import MariaDBServer
    from tests.support.s3_server import S3Server
    from tests.support.spark_cluster import SparkCluster

    work = tempfile.mkdtemp(prefix="mysqlcdc-bench-cluster-")
    server, s3, cluster = MariaDBServer(), S3Server(), SparkCluster()
    try:
        server.start()
        s3.start()
        cluster.start()
        t = time.monotonic()
        load_orders(server, args.rows)
        log.info("loaded %d rows in %.1fs; cluster %s, S3 %s", args.rows, time.monotonic() - t,
                 cluster.master_url, s3.endpoint_url)  # fmt: skip
        runs: dict[str, list[dict[str, Any]]] = {"spark_jdbc": [], "local": [], "cluster_s3": []}
        for r in range(args.rounds):  # interleaved: drift in the machine's load hits every side
            for kind in runs:
                conf = {"source": server.cdc_settings().to_dict(), "master": cluster.master_url, "rows": args.rows,
                        "chunk_size": args.chunk_size, "chunks_per_group": args.chunks_per_group,
                        "work": f"{work}/{kind}{r}", "s3": s3.storage_options(), "s3_root": s3.url(f"{kind}{r}")}
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--measure", kind],
                    env={**os.environ, CONF_ENV: json.dumps(conf), "PYSPARK_PYTHON": sys.executable},
                    capture_output=True, text=True,
                )  # fmt: skip
                line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH_RESULT ")), None)
                if out.returncode or line is None:
                    raise SystemExit(f"{kind} round {r} failed:\n{out.stderr[-3000:]}")
                runs[kind].append(json.loads(line.split(" ", 1)[1]))
                log.info("round %d: %s %.2fs", r, kind, runs[kind][-1]["seconds"])

        def median(kind: str) -> float:
            xs = sorted(x["seconds"] for x in runs[kind])
            return xs[len(xs) // 2]

        rate = {k: runs[k][0]["rows"] / median(k) for k in runs}
        print(json.dumps({
            "rows": args.rows,
            "rounds": args.rounds,
            "groups": runs["local"][0]["groups"],
            "chunks": runs["local"][0]["chunks"],
            "cluster_s3_rows_per_s": round(rate["cluster_s3"]),
            "local_rows_per_s": round(rate["local"]),
            "spark_jdbc_rows_per_s": round(rate["spark_jdbc"]),
            "ratio_of_medians_cluster_s3_vs_local": round(rate["cluster_s3"] / rate["local"], 3),
            "ratio_of_medians_cluster_s3_vs_spark_jdbc": round(rate["cluster_s3"] / rate["spark_jdbc"], 3),
            "ratio_of_medians_local_vs_spark_jdbc": round(rate["local"] / rate["spark_jdbc"], 3),
            "seconds_all": {k: [round(x["seconds"], 2) for x in v] for k, v in runs.items()},
            "load_average_1m": round(os.getloadavg()[0], 2),
        }))
        return 0
    finally:
        cluster.destroy()
        s3.destroy()
        server.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
