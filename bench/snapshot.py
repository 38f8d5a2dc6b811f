"""Snapshot throughput benchmark: watermark-bracketed group snapshot into Delta vs plain reads.

    .venv/bin/python bench/snapshot.py [--rows 2000000] [--chunk-size 125000] [--chunks-per-group 8]

Creates its own private MariaDB and a table shaped like a typical fact table (BIGINT PK, INT,
VARCHAR(16), DECIMAL(12,2), DATETIME(6), VARCHAR(200) of ~100 chars, TINYINT), then, in one run
and one Spark session (local[2]):

* snapshot: both split groups, run one after the other (Spark parallelism inside a group), while
  a writer changes ~200 rows/s of the table: rows/s from the first low watermark to the last Delta
  commit (``snapshot_rows_per_s``, ``ratio_vs_spark_jdbc``); planning the chunks (the Airflow plan
  task) is timed separately and also reported folded in (``ratio_incl_plan_vs_spark_jdbc``);
* spark_jdbc: what a Spark user would run instead — a plain JDBC read (8 partitions on the PK,
  fetchsize 10000) written to Parquet, no consistency work;
* cli: ``mariadb --quick`` reading the table to /dev/null.

Ends with one JSON line on stdout (the figures); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_provider_mysqlcdc.cdc import types as cdc_types
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.source.planner import plan_snapshot
from airflow_provider_mysqlcdc.spark_session import build_spark_session
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.testing.bench_data import load_orders as load
from airflow_provider_mysqlcdc.testing.mariadb import CDC_PASSWORD, CDC_USER, MariaDBServer

log = logging.getLogger("bench.snapshot")


class Writer(threading.Thread):
    """~rate single-row changes per second (updates, some inserts and deletes) until stopped."""

    def __init__(self, server: MariaDBServer, rows: int, rate: float):
        super().__init__(daemon=True)
        self.server, self.rows, self.rate = server, rows, rate
        self.stop_event = threading.Event()
        self.done = 0

    def run(self) -> None:
        rnd = random.Random(7)
        conn = self.server.root_connection("bench")
        cur = conn.cursor()
        next_id = self.rows + 1
        t0 = time.monotonic()
        while not self.stop_event.is_set():
            r = rnd.random()
            k = rnd.randint(1, self.rows)
            if r < 0.8:
                cur.execute("UPDATE orders SET customer = customer + 1, flag = 2 WHERE id = %s", (k,))
            elif r < 0.9:
                cur.execute(
                    "INSERT INTO orders VALUES (%s, 1, 'NEW', 1.50, NOW(6), 'inserted during snapshot', 1)", (next_id,)
                )
                next_id += 1
            else:
                cur.execute("DELETE FROM orders WHERE id = %s", (k,))
            self.done += 1
            delay = t0 + self.done / self.rate - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
        conn.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--chunk-size", type=int, default=125_000)
    p.add_argument("--chunks-per-group", type=int, default=8)
    p.add_argument("--write-rate", type=float, default=200.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    work = tempfile.mkdtemp(prefix="mysqlcdc-bench-")
    server = MariaDBServer()
    server.start()
    spark = None
    try:
        t = time.monotonic()
        load(server, args.rows)
        log.info("loaded %d rows in %.1fs", args.rows, time.monotonic() - t)
        settings = server.cdc_settings()
        spark = build_spark_session("mysqlcdc-bench", master="local[2]")

        # (b) plain Spark JDBC -> Parquet; run once to warm the JVM/JIT, then timed
        def spark_jdbc(dest: str) -> float:
            props = cdc_types.jdbc_properties(settings)
            props["fetchsize"] = "10000"
            t0 = time.monotonic()
            df = spark.read.jdbc(
                cdc_types.jdbc_url(settings), "bench.orders", column="id", lowerBound=1, upperBound=args.rows,
                numPartitions=8, properties=props,
            )
            df.write.mode("overwrite").parquet(dest)
            return time.monotonic() - t0

        spark_jdbc(f"{work}/warmup")
        jdbc_secs = spark_jdbc(f"{work}/plain")
        log.info("plain Spark JDBC: %.2fs", jdbc_secs)

        # (a) the C client
        t0 = time.monotonic()
        with open(os.devnull, "wb") as devnull:
            subprocess.run(
                ["mariadb", "--quick", "--batch", "-h127.0.0.1", f"-P{server.port}", f"-u{CDC_USER}",
                 f"-p{CDC_PASSWORD}", "-e", "SELECT * FROM bench.orders"],
                stdout=devnull, check=True,
            )
        cli_secs = time.monotonic() - t0
        log.info("mariadb --quick: %.2fs", cli_secs)

        # the snapshot, under a concurrent writer
        store = StateStore(f"{work}/state", "bench")
        sink = DeltaSink(f"{work}/lake")
        writer = Writer(server, args.rows, args.write_rate)
        writer.start()
        t0 = time.monotonic()
        with settings.connect() as conn:
            plan = plan_snapshot(conn, ["bench.orders"], args.chunk_size, args.chunks_per_group)
        plan_secs = time.monotonic() - t0
        store.write_plan("p1", plan.to_dict())
        t1 = time.monotonic()
        results = [run_snapshot_group(spark, settings, store, "p1", g.group_id, sink) for g in plan.groups]
        snap_secs = time.monotonic() - t1
        writer.stop_event.set()
        writer.join()
        # The plain read again: the faster of two runs is the baseline (the ratio errs against us).
        jdbc_secs = min(jdbc_secs, spark_jdbc(f"{work}/plain2"))
        snap_rows = sum(r.rows for r in results)
        delta_rows = sink.open("bench.orders").to_pyarrow_dataset().count_rows()
        out = {
            "rows": args.rows,
            "groups": len(plan.groups),
            "chunks": len(plan.splits),
            "snapshot_rows": snap_rows,
            "delta_rows": delta_rows,
            "snapshot_seconds": round(snap_secs, 3),
            "plan_seconds": round(plan_secs, 3),
            "spark_jdbc_seconds": round(jdbc_secs, 3),
            "cli_seconds": round(cli_secs, 3),
            "window_changes": sum(r.window_changes for r in results),
            "writer_changes": writer.done,
            "snapshot_rows_per_s": round(snap_rows / snap_secs),
            "spark_jdbc_rows_per_s": round(args.rows / jdbc_secs),
            "cli_rows_per_s": round(args.rows / cli_secs),
            "ratio_vs_spark_jdbc": round((snap_rows / snap_secs) / (args.rows / jdbc_secs), 3),
            "end_to_end_rows_per_s": round(snap_rows / (snap_secs + plan_secs)),
            "ratio_incl_plan_vs_spark_jdbc": round((snap_rows / (snap_secs + plan_secs)) / (args.rows / jdbc_secs), 3),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(out))
        return 0
    finally:
        if spark is not None:
            spark.stop()
        server.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
