"""Table maintenance of many small tables: one round in one pause against a round spread over pauses.

    .venv/bin/python bench/maintenance.py [--tables 100] [--batches 20] [--budget 0.25]

Builds ``--tables`` small Delta tables through the sink (2,000 rows, then ``--batches`` - 1 five-row
MERGE batches each), maintains every table twice in a row (what one pause between two batches did
before: the first round also sets the retention properties), then runs one round through the
stream's ``MaintenanceRounds`` with ``--budget`` seconds per pause (a quarter of a 1 s trigger).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa

from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy, maintain_table
from airflow_provider_mysqlcdc.stream.maintenance_rounds import MaintenanceRounds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=100)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--budget", type=float, default=0.25)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-maintenance-") as root:
        sink = DeltaSink(root, owner="bench")
        schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
        no_deletes = pa.table({"id": pa.array([], pa.int64())})
        tables = [f"db.t{i:04d}" for i in range(args.tables)]
        t0 = time.monotonic()
        for t in tables:
            sink.prepare_table(t, schema, ["id"])
            sink.apply_changes(t, pa.table({"id": list(range(2000)), "v": ["x"] * 2000}, schema=schema), no_deletes,
                               ["id"], "bench", 0)  # fmt: skip
            for b in range(1, args.batches):
                ids = list(range(b * 10, b * 10 + 5))
                sink.apply_changes(t, pa.table({"id": ids, "v": ["y"] * 5}, schema=schema), no_deletes, ["id"],
                                   "bench", b)  # fmt: skip
        built = time.monotonic() - t0
        one_pause = []
        per_table = []
        for _ in range(2):
            r0 = time.monotonic()
            secs = []
            for t in tables:
                s = time.monotonic()
                maintain_table(sink, t, MaintenancePolicy(), orphans=True)
                secs.append(time.monotonic() - s)
            one_pause.append(round(time.monotonic() - r0, 3))
            per_table.append({"median_ms": round(statistics.median(secs) * 1000, 1),
                              "max_ms": round(max(secs) * 1000, 1)})  # fmt: skip
        rounds = MaintenanceRounds(sink, MaintenancePolicy(interval_seconds=1), budget_seconds=args.budget)
        time.sleep(1.05)
        pauses = []
        summary = None
        while summary is None:
            s = time.monotonic()
            summary = rounds.step(tables, lambda: True)
            pauses.append(time.monotonic() - s)
    print(json.dumps({
        "tables": args.tables, "batches": args.batches, "build_seconds": round(built, 1),
        "one_pause_round_seconds": one_pause, "per_table": per_table, "budget_seconds": args.budget,
        "spread_pauses": len(pauses), "spread_pause_max_ms": round(max(pauses) * 1000),
        "spread_pause_median_ms": round(statistics.median(pauses) * 1000),
        "spread_total_seconds": round(sum(pauses), 2), "spread_tables_done": len(summary["tables"]),
    }))


if __name__ == "__main__":
    main()
