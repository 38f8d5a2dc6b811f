"""Soak benchmark: an hour of streaming compressed — 2,000 micro-batches on one table, with maintenance.

    .venv/bin/python bench/soak.py [--batches 2000] [--rows 50000] [--interval 10] [--retention-seconds 5]
    .venv/bin/python bench/soak.py --scenario small-tables [--minutes 30] [--rate 20]

Each micro-batch is one small transaction (1-6 single-row updates, inserts and deletes) on a
``--rows``-row MariaDB table, read from the binlog by the source's task body and applied by the
stream's ``BatchApplier``, which maintains the table (compaction, checkpoint, vacuum) every
``--interval`` seconds with a retention of ``--retention-seconds`` (the production default is one
hour; the retention only sets how much history stays, the mechanics are the same). A reader thread
reads the latest version throughout. Without maintenance the same run is repeated for the figure
to compare with (``--no-baseline`` skips it).

Reports (one JSON line): disk use / live data after the last round (``disk_factor``, target <= 3),
reader errors and inconsistent versions (target 0), whether a replayed batch id is still skipped,
sink == source, and the same disk factor without maintenance.

``--scenario small-tables`` (``tests/support/small_tables_soak.py``) runs the real stream at its
default settings (``StreamOptions()``: trigger 1 s, ``rewrite_below_mb``, the maintenance interval
and retentions) for ``--minutes`` over four routed shards of ~1.6 MB (one Delta table) and three
plain small tables while a writer makes ``--rate`` transactions a second, then reports the lake on
disk against its live data (sampled all along and right after each maintenance round; target <= 3
after maintenance) and whether every table equals its source.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy
from airflow_provider_mysqlcdc.spark_session import build_spark_session
from tests.support.mariadb import MariaDBServer
from tests.support.small_tables_soak import run_small_tables_soak
from tests.support.soak import run_soak

log = logging.getLogger("bench.soak")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--interval", type=float, default=10.0, help="seconds between maintenance rounds")
    p.add_argument("--retention-seconds", type=float, default=5.0)
    p.add_argument("--no-baseline", action="store_true", help="skip the run without maintenance")
    p.add_argument("--scenario", choices=["one-table", "small-tables"], default="one-table")
    p.add_argument("--minutes", type=float, default=30.0, help="small-tables: how long the writer writes")
    p.add_argument("--rate", type=float, default=20.0, help="small-tables: the writer's transactions per second")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("airflow_provider_mysqlcdc", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.scenario == "small-tables":
        return small_tables(args)
    t0 = time.monotonic()
    spark = build_spark_session("mysqlcdc-bench-soak", master="local[2]")
    out: dict = {}
    try:
        runs = [("maintained", args.interval)] + ([] if args.no_baseline else [("unmaintained", 0.0)])
        for name, interval in runs:
            server = MariaDBServer()
            server.start()
            work = Path(tempfile.mkdtemp(prefix=f"mysqlcdc-soak-{name}-"))
            try:
                hours = args.retention_seconds / 3600
                policy = MaintenancePolicy(interval_seconds=interval, retention_hours=hours,
                                           log_retention_hours=2 * hours)  # fmt: skip
                res = run_soak(server, spark, work, args.batches, args.rows, policy)
                log.info("%s: %s", name, res)
                out[name] = res
            finally:
                server.destroy()
                shutil.rmtree(work, ignore_errors=True)
    finally:
        spark.stop()
    m = out["maintained"]
    print(json.dumps({
        "batches": args.batches, "rows": args.rows, "interval_s": args.interval,
        "retention_s": args.retention_seconds, "disk_factor": m["disk_factor"],
        "disk_factor_right_after_a_compaction": m["disk_factor_right_after_a_compaction"],
        "live_bytes": m["live_bytes"], "disk_bytes": m["disk_bytes"], "log_bytes": m["log_bytes"],
        "disk_factor_at_the_last_batch": m["disk_factor_at_the_last_batch"],
        "disk_factor_without_maintenance": out.get("unmaintained", {}).get("disk_factor"),
        "reader_errors": len(m["reader_errors"]), "reader_inconsistent": len(m["reader_inconsistent"]),
        "reader_versions": m["reader_versions"], "replay_skipped": m["replay_skipped"],
        "sink_matches_source": m["sink_matches_source"], "runs": out,
        "total_seconds": round(time.monotonic() - t0, 1),
    }))  # fmt: skip
    return 0


def small_tables(args: argparse.Namespace) -> int:
    """The small-tables scenario at the stream's defaults (module doc); one JSON line."""
    t0 = time.monotonic()
    spark = build_spark_session("mysqlcdc-bench-soak-small", master="local[2]")
    server = MariaDBServer()
    server.start()
    work = Path(tempfile.mkdtemp(prefix="mysqlcdc-soak-small-"))
    try:
        out = run_small_tables_soak(server, spark, work, args.minutes, rate=args.rate)
    finally:
        server.destroy()
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    after = out["after_maintenance"] or {}
    before = out["before_maintenance"]
    print(json.dumps({
        "scenario": "small-tables", "minutes": args.minutes, "rate": args.rate,
        "writer_transactions": out["writer_transactions"],
        "live_bytes": after.get("live", before["live"]),
        "disk_before_maintenance": before["disk"], "ratio_before_maintenance": before["ratio"],
        "disk_after_maintenance": after.get("disk"), "ratio_after_maintenance": after.get("ratio"),
        "peak_ratio": out["peak_ratio"], "after_rounds": out["after_rounds"], "tables": out["tables"],
        "sink_matches_source": out["sink_matches_source"], "differences": out["differences"],
        "samples": out["samples"], "total_seconds": round(time.monotonic() - t0, 1),
    }))  # fmt: skip
    return 0 if out["sink_matches_source"] else 1


if __name__ == "__main__":
    sys.exit(main())
