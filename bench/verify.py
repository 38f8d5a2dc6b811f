"""Cost of ``verify`` on the snapshot benchmark's table, as seconds and as a ratio to its snapshot.

    .venv/bin/python bench/verify.py [--rows 2000000] [--chunk-size 125000] [--rounds 3]

Creates its own private MariaDB and the fact table of ``bench/snapshot.py`` (BIGINT PK, INT,
VARCHAR(16), DECIMAL(12,2), DATETIME(6), VARCHAR(200) of ~100 chars, TINYINT). Each round, on a
fresh pipeline and Delta root: the snapshot (plan + every chunk group, Spark ``local[2]``), a short
stream so that the pipeline has a checkpoint at the source's position (not timed), then
``verify_pipeline`` over the table (timed, with its phases: server-side chunk digests, which run
while the rest runs, lake read, lake digests and the final comparison). Rounds interleave the two,
so drift in the machine's load hits both; the headline is the ratio of the medians
(``verify_ratio_of_medians_vs_snapshot``). Every verify must report the table equal, or the
benchmark fails.

Ends with one JSON line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.spark_session import build_spark_session
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.job import StreamOptions, start_stream, stop_gracefully, wait_until_caught_up
from airflow_provider_mysqlcdc.verify import verify_pipeline
from tests.support.bench_data import load_orders
from tests.support.mariadb import MariaDBServer

log = logging.getLogger("bench.verify")
TABLE = "bench.orders"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--chunk-size", type=int, default=125_000)
    p.add_argument("--chunks-per-group", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    work = tempfile.mkdtemp(prefix="mysqlcdc-bench-verify-")
    server = MariaDBServer()
    server.start()
    spark = None
    try:
        t = time.monotonic()
        load_orders(server, args.rows)
        log.info("loaded %d rows in %.1fs", args.rows, time.monotonic() - t)
        settings = server.cdc_settings()
        spark = build_spark_session("mysqlcdc-bench-verify", master="local[2]")
        snaps: list[float] = []
        verifies: list[dict[str, Any]] = []
        for r in range(args.rounds):
            store = StateStore(f"{work}/state{r}", f"bench{r}")
            sink = DeltaSink(f"{work}/lake{r}")
            t0 = time.monotonic()
            with settings.connect() as conn:
                plan = plan_snapshot(conn, [TABLE], args.chunk_size, args.chunks_per_group)
            store.write_plan("p1", plan.to_dict())
            for g in plan.groups:
                run_snapshot_group(spark, settings, store, "p1", g.group_id, sink)
            snaps.append(time.monotonic() - t0)
            store.write_manifest(build_manifest(plan, store.read_all_results("p1")))
            query = start_stream(spark, settings, store, sink, StreamOptions(trigger_seconds=0.5, readers=1))
            try:
                with settings.connect() as conn:
                    wait_until_caught_up(query, current_offset(conn))
            finally:
                stop_gracefully(query)
            t1 = time.monotonic()
            report = verify_pipeline(settings, store, sink, [TABLE], wait_timeout=60)
            seconds = time.monotonic() - t1
            if not report.ok:
                raise SystemExit(f"round {r}: verify found differences on a clean table:\n{report.summary()}")
            v = report.verdicts[0]
            verifies.append({"seconds": seconds, **report.seconds, "chunks": v.chunks, "rows": v.source_rows})
            log.info("round %d: snapshot %.2fs, verify %.2fs (%s)", r, snaps[-1], seconds, report.seconds)
            shutil.rmtree(f"{work}/lake{r}", ignore_errors=True)

        med_snap = statistics.median(snaps)
        med_verify = statistics.median(v["seconds"] for v in verifies)
        out = {
            "rows": args.rows,
            "rounds": args.rounds,
            "chunks": verifies[0]["chunks"],
            "verify_seconds_median": round(med_verify, 3),
            "snapshot_seconds_median": round(med_snap, 3),
            "verify_ratio_of_medians_vs_snapshot": round(med_verify / med_snap, 3),
            "verify_rows_per_s": round(args.rows / med_verify),
            "verify_source_seconds_median": round(statistics.median(v["source_s"] for v in verifies), 3),
            "verify_lake_read_seconds_median": round(statistics.median(v["lake_read_s"] for v in verifies), 3),
            "verify_lake_digest_seconds_median": round(statistics.median(v["lake_digest_s"] for v in verifies), 3),
            "verify_compare_seconds_median": round(statistics.median(v["compare_s"] for v in verifies), 3),
            "verify_seconds_all": [round(v["seconds"], 3) for v in verifies],
            "snapshot_seconds_all": [round(s, 3) for s in snaps],
            "tables_equal": True,
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
