"""Many small tables against one big one: snapshot + handoff rate, and stream lag over many tables.

    .venv/bin/python bench/many_tables.py [--tables 500] [--rows 2000] [--rounds 3]
                                          [--lag-seconds 30] [--lag-rate 500] [--lag-rounds 1]

Creates its own private MariaDB with ``--tables`` tables of ``--rows`` rows (database ``many``,
BIGINT key, INT, VARCHAR(40)) and one table holding the same number of rows in total (database
``one``). Each round snapshots both into fresh lakes through ``plan_run`` / ``run_snapshot_group``
/ ``finalize_run`` (the snapshot and the handoff: the manifest the stream starts from; Spark
``local[2]``, groups one after another in this process), in alternating order. Figures:
``many_tables_rows_per_s`` and ``one_table_rows_per_s`` (medians), and ``ratio_vs_one_table`` =
median many-tables rate / median one-table rate (target >= 0.5); the per-round ratios are shown too.

Then the stream (``run_stream`` in a thread, the product's defaults) runs over the last many-table
lake; once it has started and applied what the source holds (``stream_start_s``: the query's start,
the tables' first loads, the first batch) and then one change in every table
(``stream_first_batch_s``: the first batch with changes starts the Python workers and the apply
processes or threads), a writer in a process of its own commits ``--lag-rate``
single-row UPDATE transactions/s spread uniformly over all tables for ``--lag-seconds``; each
UPDATE writes a sequence number, and a change's lag is the commit time of the first Delta version
of its table that holds it (read from the tables' logs after the run) minus when its source
commit returned (``lag_p50_s``,
``lag_p99_s``, target p99 < 3 s). With ``--lag-rounds N`` the stream runs 2N times, alternating the
product's defaults with a reference (``--reference merge``: MERGE-only apply, ``rewrite_below_mb=0,
deletion_vectors=False``; ``--reference threads``: the driver's threads, ``apply_processes=0``),
and the lag figures are medians over each side's rounds, with ``lag_p99_ratio_vs_<reference>``.
Every table must equal its source (row count and sum) after each stream run caught up, or the benchmark fails.

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
import time
from typing import Any
from urllib.parse import unquote

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.stream.control import wait_until_applied
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from tests.support.bench_env import bench_environment, print_result, snapshot_pipeline
from tests.support.lag_writers import ProcessWriter, update_random_tables
from tests.support.stream_thread import StreamThread

log = logging.getLogger("bench.many_tables")
SEQ_BASE = 1_000_000_000  # the lag writer's values: above anything the load wrote
#: What the defaults are compared with (--reference): MERGE-only apply, or no apply processes.
REFERENCES = {"merge": StreamOptions(rewrite_below_mb=0, deletion_vectors=False),
              "threads": StreamOptions(apply_processes=0)}  # fmt: skip


def _load(server: Any, tables: int, rows: int) -> None:
    server.execute("CREATE DATABASE many", "CREATE DATABASE one")
    stmts = []
    for i in range(tables):
        stmts += [f"CREATE TABLE many.t{i:03d} (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(40))",
                  f"INSERT INTO many.t{i:03d} SELECT seq, seq, CONCAT('row ', seq) FROM seq_1_to_{rows}"]  # fmt: skip
    server.execute(*stmts, database="many")  # seq_1_to_N: MariaDB's sequence engine, in the current database
    server.execute("CREATE TABLE one.t (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(40))",
                   f"INSERT INTO one.t SELECT seq, seq, CONCAT('row ', seq) FROM seq_1_to_{tables * rows}",
                   database="one")  # fmt: skip


def _snapshot(spark: Any, settings: Any, work: str, name: str, tables: list[str]) -> tuple[float, Any, Any]:
    config = PipelineConfig.from_params(pipeline_id=name, sink_root=f"{work}/lake-{name}",
                                        state_root=f"{work}/state-{name}", tables=tables)  # fmt: skip
    t0 = time.perf_counter()
    store, sink = snapshot_pipeline(spark, settings, config)
    return time.perf_counter() - t0, store, sink


def _rows_in(sink: DeltaSink, tables: list[str]) -> int:
    return sum(sink.open(t).to_pyarrow_dataset().count_rows() for t in tables)


def visible_at(sink: DeltaSink, tables: list[str], since: float, floor: int) -> dict[int, float]:
    """When each lag value (``>= floor``) first became visible: the commit time (the log entry's
    ``commitInfo.timestamp``) of the first version of its table whose added files hold it. Read from
    the Delta logs after the run, so it holds wherever the stream applied the table (its driver or an
    apply process); versions committed before ``since`` (wall time) are skipped."""
    seen: dict[int, float] = {}
    for t in tables:
        root = sink.table_uri(t)
        for name in sorted(os.listdir(f"{root}/_delta_log")):
            if not name.endswith(".json"):
                continue
            with open(f"{root}/_delta_log/{name}") as f:
                entries = [json.loads(line) for line in f if line.strip()]
            info = next((e["commitInfo"] for e in entries if "commitInfo" in e), None)
            if info is None or info.get("timestamp", 0) / 1000 < since:
                continue
            at = info["timestamp"] / 1000
            for e in entries:
                if "add" not in e:
                    continue
                v = pq.read_table(f"{root}/{unquote(e['add']['path'])}", columns=["v"]).column("v")
                for value in pc.filter(v, pc.greater_equal(v, floor)).to_pylist():
                    seen.setdefault(value, at)
    return seen


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _sink_matches(server: Any, sink: DeltaSink, tables: list[str]) -> bool:
    for t in tables:
        count, total = server.query(f"SELECT COUNT(*), SUM(v) FROM {t}")[0]
        lake = sink.open(t).to_pyarrow_table(columns=["v"])
        if lake.num_rows != count or pc.sum(lake.column("v")).as_py() != int(total):
            log.error("%s differs: source %s rows sum %s, lake %s rows sum %s", t, count, total, lake.num_rows,
                      pc.sum(lake.column("v")).as_py())  # fmt: skip
            return False
    return True


def lag_run(spark: Any, server: Any, settings: Any, store: Any, sink: DeltaSink, tables: list[str], rows: int,
            rate: float, seconds: float, options: StreamOptions | None = None,
            run: int = 0) -> dict[str, Any]:  # fmt: skip
    th = StreamThread(spark, settings, store, sink, run_id="bench-many-tables", options=options or StreamOptions())
    started = time.monotonic()
    th.start_running(timeout=300)
    if th.error is not None:
        raise RuntimeError(f"the stream failed to start: {th.error}")
    try:
        # the lag is the running stream's: the writer starts once the stream has applied what the source
        # holds now (its start-up — the query, the tables' first loads, the first batch — is reported apart)
        th.wait_applied(settings, timeout=600)
        start_secs = time.monotonic() - started
        # and once it has applied a first batch of changes over every table (its Python workers and
        # apply threads started, as in a stream that has been running)
        server.execute(*(f"UPDATE {t} SET v = v + 1 WHERE id = 1" for t in tables))
        th.wait_applied(settings, timeout=600)
        warm_secs = time.monotonic() - started - start_secs
        # in a process of its own, as a source application is: not contending for the stream's GIL
        floor = SEQ_BASE + run * 10_000_000
        writer = ProcessWriter(update_random_tables, socket=server.socket, tables=tables, rows=rows, rate=rate,
                               seconds=seconds, first_value=floor, seed=3 + run)  # fmt: skip
        since = time.time()
        t0 = time.monotonic()
        writer.start()
        writer.join()
        write_secs = time.monotonic() - t0
        if writer.error is not None:
            raise RuntimeError(f"the lag writer failed: {writer.error}")
        with settings.connect() as conn:
            target = current_offset(conn)
        wait_until_applied(store, target, timeout=600)
    finally:
        th.stop_event.set()
        th.join(timeout=300)
    if th.error is not None:
        raise RuntimeError(f"the stream failed: {th.error}")
    seen = visible_at(sink, tables, since - 1.0, floor)
    lags = [seen[s] - c for s, c in writer.committed.items() if s in seen]
    missing = len(writer.committed) - len(lags)  # overwritten by a later value in the same batch
    return {
        "stream_start_s": round(start_secs, 3),
        "stream_first_batch_s": round(warm_secs, 3),
        "lag_changes": len(writer.committed),
        "lag_write_rate": round(len(writer.committed) / write_secs, 1),
        "lag_superseded_in_batch": missing,
        "lag_p50_s": round(_pct(lags, 0.50), 3),
        "lag_p90_s": round(_pct(lags, 0.90), 3),
        "lag_p99_s": round(_pct(lags, 0.99), 3),
        "lag_max_s": round(max(lags), 3),
        "lag_sink_matches_source": _sink_matches(server, sink, tables),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", type=int, default=500)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lag-seconds", type=float, default=30.0)
    p.add_argument("--lag-rate", type=float, default=500.0)
    p.add_argument("--lag-rounds", type=int, default=1,
                   help="stream runs per side, alternating the defaults with the reference")
    p.add_argument("--reference", choices=sorted(REFERENCES), default="merge",
                   help="the reference of --lag-rounds: MERGE-only apply, or the driver's threads (apply_processes=0)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    total = args.tables * args.rows
    many = [f"many.t{i:03d}" for i in range(args.tables)]
    with bench_environment("bench-many-tables") as (server, spark, work):
        _load(server, args.tables, args.rows)
        settings = server.cdc_settings()
        secs: dict[str, list[float]] = {"one": [], "many": []}
        last: tuple[Any, Any] | None = None
        for r in range(args.rounds):
            for kind in (("one", "many") if r % 2 == 0 else ("many", "one")):
                name = f"{kind}{r}"
                dt, store, sink = _snapshot(spark, settings, work, name, ["one.t"] if kind == "one" else ["many.*"])
                got = _rows_in(sink, ["one.t"] if kind == "one" else many)
                if got != total:
                    raise SystemExit(f"{name}: the lake holds {got} rows, the source {total}")
                secs[kind].append(dt)
                log.info("round %d: %s: %.2f s (%.0f rows/s)", r, kind, dt, total / dt)
                if kind == "many" and r == args.rounds - 1:
                    last = (store, sink)
                else:
                    shutil.rmtree(f"{work}/lake-{name}", ignore_errors=True)
                    shutil.rmtree(f"{work}/state-{name}", ignore_errors=True)
        one_rate = total / statistics.median(secs["one"])
        many_rate = total / statistics.median(secs["many"])
        out: dict[str, Any] = {
            "tables": args.tables,
            "rows_per_table": args.rows,
            "rounds": args.rounds,
            "one_table_seconds": [round(s, 2) for s in secs["one"]],
            "many_tables_seconds": [round(s, 2) for s in secs["many"]],
            "one_table_rows_per_s": round(one_rate),
            "many_tables_rows_per_s": round(many_rate),
            "ratio_vs_one_table": round(many_rate / one_rate, 3),
            "ratio_per_round": [round(o / m, 3) for o, m in zip(secs["one"], secs["many"], strict=True)],
            "seconds_per_table": round(statistics.median(secs["many"]) / args.tables, 3),
        }
        assert last is not None
        ref = args.reference
        runs: dict[str, list[dict[str, Any]]] = {"default": [], ref: []}
        sides = [("default", StreamOptions()), (ref, REFERENCES[ref])]
        for r in range(args.lag_rounds):
            for side, options in sides if r % 2 == 0 or args.lag_rounds == 1 else sides[::-1]:
                if args.lag_rounds == 1 and side == ref:
                    continue
                log.info("lag (%s): %.0f tx/s over %d tables for %.0f s", side, args.lag_rate, args.tables,
                         args.lag_seconds)  # fmt: skip
                got = lag_run(spark, server, settings, last[0], last[1], many, args.rows, args.lag_rate,
                              args.lag_seconds, options, run=sum(map(len, runs.values())))  # fmt: skip
                if not got["lag_sink_matches_source"]:
                    raise SystemExit(f"the lake differs from the source after the stream ({side}): {got}")
                runs[side].append(got)
        out.update(_median_lags(runs["default"]))
        if runs[ref]:
            out.update({f"{k.replace('lag_', f'lag_{ref}_', 1)}": v for k, v in _median_lags(runs[ref]).items()})
            out[f"lag_p99_ratio_vs_{ref}"] = round(out["lag_p99_s"] / out[f"lag_{ref}_p99_s"], 3)
            out["lag_p99_per_round"] = {s: [g["lag_p99_s"] for g in runs[s]] for s in runs}
        print_result(out)


def _median_lags(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The lag figures as medians over ``runs`` (one run: its own figures)."""
    keys = [k for k in runs[0] if k.startswith(("lag_", "stream_")) and isinstance(runs[0][k], int | float)
            and not isinstance(runs[0][k], bool)]  # fmt: skip
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    out["lag_sink_matches_source"] = all(r["lag_sink_matches_source"] for r in runs)
    return out


if __name__ == "__main__":
    main()
