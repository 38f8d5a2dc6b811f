"""Cost of change history: ``metadata_columns`` and ``changelog_tables`` against a plain pipeline.

    .venv/bin/python bench/history.py [--rows 1000000] [--chunk-size 125000] [--rounds 3]
                                      [--batches 10] [--batch-rows 2000]

Creates its own private MariaDB and the fact table of ``bench/snapshot.py``. Each round runs, on
fresh pipelines and Delta roots, four variants — plain, metadata columns, changelog, both —
interleaved:

* the snapshot through ``plan_run`` + ``run_snapshot_group`` + ``finalize_run`` (Spark
  ``local[2]``, native reader): wall time of the groups and the finalize;
* then ``--batches`` micro-batches of ``--batch-rows`` single-row updates spread over the table,
  applied by the stream's own ``BatchApplier`` (change blocks built as the stream's tasks build
  them, full before images as a changelog table gets): median seconds per batch.

Headline: each variant's median over rounds as a ratio to the plain pipeline's in the same round
(snapshot and batch apply). The mirror must equal the source after the snapshot, or the benchmark
fails. A discarded warm-up run comes first. Ends with one JSON line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import sys
import time
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.change_block import BlockBuilder, block_schema, encode_block
from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.stream.applier import BatchApplier
from tests.support.bench_data import load_orders
from tests.support.bench_env import bench_environment, print_result, snapshot_pipeline
from tests.support.mariadb import MariaDBServer
from tests.support.verify import compare

log = logging.getLogger("bench.history")
TABLE = "bench.orders"
VARIANTS = {"plain": {}, "metadata": {"metadata_columns": True}, "changelog": {"changelog_tables": [TABLE]},
            "both": {"metadata_columns": True, "changelog_tables": [TABLE]}}  # fmt: skip


def _row(i: int, v: int) -> dict[str, Any]:
    """A row of ``load_orders``' shape in canonical values, with ``customer`` set to ``v``."""
    created = datetime(2026, 1, 1) + timedelta(seconds=i, microseconds=i % 1_000_000)
    return {"id": i, "customer": v, "code": f"C{i % 999983:010d}", "amount": Decimal(i % 1_000_000) / 100,
            "created": created, "note": f"note {i} ".ljust(100, "x"), "flag": i % 3}  # fmt: skip


def _batches(arrow: pa.Schema, rows: int, count: int, size: int, seed: int) -> list[pa.Table]:
    """``count`` micro-batches of ``size`` single-row updates at random keys, as the stream hands them
    to the applier (one change block per batch, full before images)."""
    rnd = random.Random(seed)
    out = []
    for b in range(count):
        builder = BlockBuilder(block_schema(arrow, ["id"], full_before=True))
        for j in range(size):
            i = rnd.randint(1, rows)
            pos = 10_000 + (b * size + j) * 300
            builder.add("u", "mysql-bin.000009", pos, 9, pos + 80, 0, b * size + j, 1_790_000_000 + b,
                        _row(i, i % 100003), _row(i, -b))  # fmt: skip
        blob = encode_block(builder.build())
        out.append(pa.table({"tbl": [TABLE], "kind": ["rows"], "rows": [size], "first_seq": [b * size],
                             "file": ["mysql-bin.000009"], "pos": [10_000 + b * size * 300],
                             "commit_ts": [1_790_000_000 + b], "info": [None], "block": [blob]}))  # fmt: skip
    return out


def _run(spark: Any, server: MariaDBServer, root: str, variant: str, args: argparse.Namespace,
         batches: list[pa.Table]) -> tuple[float, float]:  # fmt: skip
    """One pipeline: (snapshot seconds, median seconds per applied batch)."""
    settings = server.cdc_settings()
    config = PipelineConfig.from_params(pipeline_id="hist", sink_root=f"{root}/lake", state_root=f"{root}/state",
                                        tables=[TABLE], chunk_size=args.chunk_size, chunks_per_task=10_000,
                                        max_parallel_groups=1, **VARIANTS[variant])  # fmt: skip
    t0 = time.monotonic()
    store, sink = snapshot_pipeline(spark, settings, config, reader="native")
    snapshot_s = time.monotonic() - t0
    with settings.connect() as conn:
        cmp = compare(conn, read_table_schema(conn, TableId.parse(TABLE)), sink.read(TABLE))
    if not cmp.match:
        raise SystemExit(f"{variant}: the snapshot differs from the source: {cmp.first_difference}")
    applier = BatchApplier(store, sink, store.read_manifest())
    per_batch = []
    for b, data in enumerate(batches):
        t = time.monotonic()
        applier.apply_arrow(data, b)
        per_batch.append(time.monotonic() - t)
    shutil.rmtree(root, ignore_errors=True)
    return snapshot_s, statistics.median(per_batch)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--chunk-size", type=int, default=125_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--batch-rows", type=int, default=2_000)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    with bench_environment("mysqlcdc-bench-history") as (server, spark, work):
        load_orders(server, args.rows)
        with server.cdc_settings().connect() as conn:
            arrow = cdc_types.arrow_schema(read_table_schema(conn, TableId.parse(TABLE)))
        batches = _batches(arrow, args.rows, args.batches, args.batch_rows, seed=3)
        snap: dict[str, list[float]] = {v: [] for v in VARIANTS}
        apply: dict[str, list[float]] = {v: [] for v in VARIANTS}
        _run(spark, server, f"{work}/warm-up", "both", args, batches[:2])  # JVM, Python workers, delta-rs
        for r in range(args.rounds):
            for v in VARIANTS:
                s, a = _run(spark, server, f"{work}/{v}-{r}", v, args, batches)
                snap[v].append(s)
                apply[v].append(a)
                log.info("round %d %s: snapshot %.2fs, %.3fs per batch of %d updates", r, v, s, a, args.batch_rows)
    out: dict[str, Any] = {"rows": args.rows, "rounds": args.rounds, "batch_rows": args.batch_rows}
    for v in VARIANTS:
        out[f"{v}_snapshot_s_median"] = round(statistics.median(snap[v]), 2)
        out[f"{v}_apply_s_per_batch_median"] = round(statistics.median(apply[v]), 3)
        out[f"{v}_snapshot_ratio_vs_plain"] = round(statistics.median(
            [s / p for s, p in zip(snap[v], snap["plain"], strict=True)]), 3)  # fmt: skip
        out[f"{v}_apply_ratio_vs_plain"] = round(statistics.median(
            [a / p for a, p in zip(apply[v], apply["plain"], strict=True)]), 3)  # fmt: skip
    out["tables_equal"] = True
    print_result(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
