"""Snapshot rate limit (``max_rows_per_second``): the read rate a throttled snapshot achieves.

    .venv/bin/python bench/throttle.py [--rows 400000] [--chunk-size 10000] [--rates 20000,50000] [--rounds 3]

Creates its own private MariaDB and the fact table of ``bench/snapshot.py``. Each round runs, on
fresh pipelines and Delta roots, a snapshot through ``plan_run`` (one group, ``max_parallel_groups``
1, Spark ``local[2]``) at each rate with the native reader, at the first rate with the JDBC reader,
and once unthrottled (the reference: what the source and the 2 cores allow). The figure per run is
the rows read divided by the group's read time (``GroupResult.read_seconds``: staging, which the
throttle paces; the window replay and the commit are not reads). Rounds interleave the runs; the
headline per run is the median over rounds as a ratio to the limit set (target: within 10 %).
Every snapshot must equal its source, or the benchmark fails.

Ends with one JSON line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.pipeline import plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import SnapshotOptions, run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from tests.support.bench_data import load_orders
from tests.support.bench_env import bench_environment, print_result
from tests.support.mariadb import MariaDBServer
from tests.support.verify import compare

log = logging.getLogger("bench.throttle")
TABLE = "bench.orders"


def _snapshot(spark: Any, server: MariaDBServer, root: str, rate: int | None, reader: str, chunk: int) -> float:
    """One throttled snapshot; returns the rows per second of its reads."""
    settings = server.cdc_settings()
    config = PipelineConfig.from_params(pipeline_id="bench", sink_root=f"{root}/lake", state_root=f"{root}/state",
                                        tables=[TABLE], chunk_size=chunk, chunks_per_task=10_000,
                                        max_parallel_groups=1, max_rows_per_second=rate)  # fmt: skip
    store, sink = StateStore(config.state_root, "bench"), DeltaSink(config.sink_root)
    with settings.connect() as conn:
        outcome = plan_run(conn, store, config, "p1", sink.exists)
    rows = 0
    seconds = 0.0
    for g in outcome.groups:
        res = run_snapshot_group(spark, settings, store, "p1", g["group_id"], sink, SnapshotOptions(reader=reader))
        rows, seconds = rows + res.rows, seconds + res.read_seconds
    with settings.connect() as conn:
        cmp = compare(conn, read_table_schema(conn, TableId.parse(TABLE)), sink.read(TABLE))
    if not cmp.match:
        raise SystemExit(f"the throttled snapshot ({rate} rows/s, {reader}) differs from the source: {cmp}")
    shutil.rmtree(root, ignore_errors=True)
    return rows / seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--chunk-size", type=int, default=10_000)
    p.add_argument("--rates", default="20000,50000", help="comma-separated limits in rows/s")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    rates = [int(r) for r in args.rates.split(",")]
    runs = [(f"native_{r}", r, "native") for r in rates] + [(f"jdbc_{rates[0]}", rates[0], "jdbc"),
                                                            ("unthrottled", None, "native")]  # fmt: skip
    with bench_environment("mysqlcdc-bench-throttle") as (server, spark, work):
        t = time.monotonic()
        load_orders(server, args.rows)
        log.info("loaded %d rows in %.1fs", args.rows, time.monotonic() - t)
        achieved: dict[str, list[float]] = {name: [] for name, _, _ in runs}
        for r in range(args.rounds):
            for name, rate, reader in runs:
                achieved[name].append(_snapshot(spark, server, f"{work}/{name}-{r}", rate, reader, args.chunk_size))
                log.info("round %d %s: %.0f rows/s read (limit %s)", r, name, achieved[name][-1], rate)
    out: dict[str, Any] = {"rows": args.rows, "chunk_size": args.chunk_size, "rounds": args.rounds}
    for name, rate, _ in runs:
        med = statistics.median(achieved[name])
        out[f"{name}_rows_per_s_median"] = round(med)
        out[f"{name}_rows_per_s_all"] = [round(v) for v in achieved[name]]
        if rate:
            out[f"{name}_ratio_to_limit"] = round(med / rate, 3)
    out["within_10_percent"] = all(abs(out[f"{n}_ratio_to_limit"] - 1) <= 0.1 for n, r, _ in runs if r)
    out["tables_equal"] = True
    print_result(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
