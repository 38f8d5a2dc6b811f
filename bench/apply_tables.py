"""A micro-batch that touches many tables: applied one table after another, or several at once.

    .venv/bin/python bench/apply_tables.py [--tables 40] [--rows 2000] [--updates 50] [--batches 8]
                                           [--threads 1,4] [--rounds 3]

Creates its own private MariaDB with ``--tables`` tables of ``--rows`` rows (BIGINT key, INT,
VARCHAR(40)), snapshots them once through ``plan_run`` / ``run_snapshot_group`` / ``finalize_run``
(Spark ``local[2]``), then copies the lake and state per run. Each run applies ``--batches``
micro-batches, each holding ``--updates`` single-row updates of every table, with the stream's own
``BatchApplier`` at ``apply_threads`` = each value of ``--threads`` (inside each of ``--processes``
apply processes when given; change blocks built as the
stream's tasks build them). The figure is the median seconds per batch; rounds interleave the
settings, the headline is the median of the per-round ratios to ``apply_threads=1``. After each run
every table must hold the values of the last batch, or the benchmark fails.

Ends with one JSON line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa

from airflow_provider_mysqlcdc.core.change_block import BlockBuilder, block_schema, encode_block
from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.applier import BatchApplier
from airflow_provider_mysqlcdc.stream.apply_processes import ApplyProcesses
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from tests.support.bench_env import bench_environment, print_result, snapshot_pipeline

log = logging.getLogger("bench.apply_tables")
ARROW = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.int32()), pa.field("s", pa.string())])


def _batches(tables: list[str], rows: int, updates: int, count: int) -> tuple[list[pa.Table], dict[str, dict]]:
    """The micro-batches (one change block per table each) and every table's last value per key."""
    rnd = random.Random(5)
    out, last = [], {t: {} for t in tables}
    for b in range(count):
        meta: dict[str, list[Any]] = {k: [] for k in ("tbl", "kind", "rows", "first_seq", "file", "pos",
                                                       "commit_ts", "info", "block")}  # fmt: skip
        for n, t in enumerate(tables):
            builder = BlockBuilder(block_schema(ARROW, ["id"]))
            for j in range(updates):
                i, seq = rnd.randint(1, rows), (b * len(tables) + n) * updates + j
                value = b * 1_000_000 + n * 1_000 + j
                builder.add("u", "mysql-bin.000009", 4 + seq * 200, 9, 4 + seq * 200 + 60, 0, seq, 1_790_000_000,
                            {"id": i}, {"id": i, "v": value, "s": f"b{b}"})  # fmt: skip
                last[t][i] = value
            for k, v in (("tbl", t), ("kind", "rows"), ("rows", updates), ("first_seq", n * updates),
                         ("file", "mysql-bin.000009"), ("pos", 4), ("commit_ts", 1_790_000_000), ("info", None),
                         ("block", encode_block(builder.build()))):  # fmt: skip
                meta[k].append(v)
        out.append(pa.table(meta))
    return out, last


def _run(base: str, root: str, threads: int, batches: list[pa.Table], last: dict[str, dict],
         processes: int = 0) -> float:  # fmt: skip
    shutil.copytree(base, root)
    store, sink = StateStore(f"{root}/state", "many"), DeltaSink(f"{root}/lake", owner="many")
    seconds = []
    with ApplyProcesses(processes) if processes else contextlib.nullcontext(None) as procs:
        options = StreamOptions(apply_threads=threads, apply_processes=processes)
        applier = BatchApplier(store, sink, store.read_manifest(), options, processes=procs)
        for b, data in enumerate(batches):
            t = time.monotonic()
            applier.apply_arrow(data, b)
            seconds.append(time.monotonic() - t)
    for t, want in last.items():
        got = sink.read(t).select(["id", "v"]).to_pydict()
        have = dict(zip(got["id"], got["v"], strict=True))
        bad = [k for k, v in want.items() if have.get(k) != v]
        if bad:
            raise SystemExit(f"apply_threads={threads}: {t} lacks the last batch's values at keys {bad[:5]}")
    shutil.rmtree(root, ignore_errors=True)
    return statistics.median(seconds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=40)
    p.add_argument("--rows", type=int, default=2_000)
    p.add_argument("--updates", type=int, default=50)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--threads", default="1,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--processes", type=int, default=0,
                   help="apply processes (stream/apply_processes.py) in every run, each with the threads given")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    settings_threads = [int(x) for x in args.threads.split(",")]
    with bench_environment("mysqlcdc-bench-apply-tables") as (server, spark, work):
        server.execute("CREATE DATABASE many")
        tables = [f"many.t{n:03d}" for n in range(args.tables)]
        for t in tables:
            name = t.split(".")[1]
            server.execute(f"CREATE TABLE {name} (id BIGINT PRIMARY KEY, v INT, s VARCHAR(40))",
                           f"INSERT INTO {name} SELECT seq, seq, 'seed' FROM seq_1_to_{args.rows}",
                           database="many")  # fmt: skip
        base = f"{work}/base"
        config = PipelineConfig.from_params(pipeline_id="many", sink_root=f"{base}/lake", state_root=f"{base}/state",
                                            tables=["many.*"], chunk_size=10_000)  # fmt: skip
        t0 = time.monotonic()
        snapshot_pipeline(spark, server.cdc_settings(), config)
        log.info("snapshotted %d tables in %.1fs", len(tables), time.monotonic() - t0)
        batches, last = _batches(tables, args.rows, args.updates, args.batches)
        _run(base, f"{work}/warm-up", settings_threads[-1], batches[:2], {}, args.processes)  # delta-rs, Arrow
        per_batch: dict[int, list[float]] = {n: [] for n in settings_threads}
        for r in range(args.rounds):
            for n in settings_threads:
                per_batch[n].append(_run(base, f"{work}/r{r}-t{n}", n, batches, last, args.processes))
                log.info("round %d apply_threads=%d: %.3fs per batch of %d tables", r, n, per_batch[n][-1],
                         len(tables))  # fmt: skip
    ref = settings_threads[0]
    out: dict[str, Any] = {"tables": args.tables, "updates_per_table": args.updates, "batches": args.batches,
                           "rounds": args.rounds, "processes": args.processes}  # fmt: skip
    for n in settings_threads:
        out[f"threads_{n}_s_per_batch_median"] = round(statistics.median(per_batch[n]), 3)
        out[f"threads_{n}_s_per_batch_all"] = [round(x, 3) for x in per_batch[n]]
        out[f"threads_{n}_speedup_vs_{ref}"] = round(statistics.median(
            [a / b for a, b in zip(per_batch[ref], per_batch[n], strict=True)]), 3)  # fmt: skip
    out["tables_equal_last_batch"] = True
    print_result(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
