"""Add-table benchmark: the lag of the tables already streamed while another table is added.

    .venv/bin/python bench/add_table.py [--rows 50000] [--new-rows 1000000] [--rate 50] [--backfill]

A private MariaDB with ``bench.a`` (``--rows`` rows, streamed) and ``bench.b`` (``--new-rows``
rows, added later). The stream job runs as the stream operator launches it (``spark-submit`` of
``jobs/stream.py``, detached, default settings) while a writer commits ``--rate`` single-row
updates/s to ``bench.a``, each writing a new, increasing value into ``v``. Then ``bench.b`` is added
the way the DAG adds a table: ``plan_run`` with both tables, its snapshot groups
(``run_snapshot_group`` in this process, sharing the 2 cores with the stream), and ``finalize_run``
(the hand-over: the stream pauses after its batch and resumes with the new manifest). A poller
reads ``max(v)`` of ``bench.a``'s Delta table every 0.25 s; a change's lag is the first poll that
shows it minus its commit time.

Reports (one JSON line): ``bench.a``'s lag p50 / p99 / max in the 15 s before the add-table (after
30 s of warm-up), during the snapshot
of ``bench.b``, and around the hand-over (from the pause request to 10 s after it); how long the
stream was paused; and whether both tables equal their sources at the end.

``--backfill`` measures the online backfill instead: both tables are captured and streamed from the
start, the writer also updates random rows of ``bench.b`` at the same rate, and ``bench.b`` is
re-snapshotted the way the DAG's ``resnapshot_tables`` param does it (``plan_run`` with it, its
groups, ``finalize_run``) while the stream keeps applying ``bench.a`` and ``bench.b``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.spark_session import build_spark_session
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import RUN, request_stop, wait_until_applied
from airflow_provider_mysqlcdc.stream.launcher import launch_detached
from tests.support.mariadb import MariaDBServer
from tests.support.verify import compare

log = logging.getLogger("bench.add_table")
JOB = Path(__file__).resolve().parents[1] / "airflow_provider_mysqlcdc" / "jobs" / "stream.py"
BASE = 1_000_000_000


class Writer(threading.Thread):
    def __init__(self, server: MariaDBServer, rows: int, rate: float, other_rows: int = 0):
        super().__init__(daemon=True)
        self.server, self.rows, self.rate, self.other_rows = server, rows, rate, other_rows
        self.committed: list[tuple[int, float]] = []  # (value, wall time the commit returned)
        self.stop_event = threading.Event()

    def run(self) -> None:
        conn = self.server.root_connection("bench")
        cur = conn.cursor()
        rnd = random.Random(5)
        t0 = time.monotonic()
        i = 0
        while not self.stop_event.is_set():
            value = BASE + i
            cur.execute("UPDATE a SET v = %s WHERE id = %s", (value, rnd.randint(1, self.rows)))
            self.committed.append((value, time.time()))
            if self.other_rows:  # --backfill: the re-snapshotted table changes too
                cur.execute("UPDATE b SET v = %s WHERE id = %s", (-i, rnd.randint(1, self.other_rows)))
            i += 1
            delay = t0 + i / self.rate - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
        conn.close()


class Poller(threading.Thread):
    """Every 0.25 s: the largest ``v`` visible in ``bench.a``'s Delta table."""

    def __init__(self, uri: str):
        super().__init__(daemon=True)
        self.uri = uri
        self.seen: list[tuple[float, int]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            t = time.time()
            try:
                dt = DeltaTable(self.uri)
                out = pa.table(QueryBuilder().register("t", dt).execute("SELECT max(v) AS m FROM t").read_all())
                self.seen.append((t, int(out.column("m")[0].as_py() or 0)))
            except Exception as exc:  # a poll can race a commit; the next one will see it
                log.debug("poll failed: %s", exc)
            self.stop_event.wait(max(0.0, 0.25 - (time.time() - t)))


def _lags(committed: list[tuple[int, float]], seen: list[tuple[float, int]], lo: float, hi: float) -> dict[str, Any]:
    out = []
    j = 0
    for value, at in committed:
        if not lo <= at < hi:
            continue
        while j < len(seen) and seen[j][1] < value:
            j += 1
        if j == len(seen):
            break
        k = j
        while k < len(seen) and seen[k][0] < at:  # a poll before the commit cannot show it
            k += 1
        if k < len(seen):
            out.append(seen[k][0] - at)
    if not out:
        return {"changes": 0}
    out.sort()
    pick = lambda q: round(out[min(len(out) - 1, int(q * (len(out) - 1)))], 2)  # noqa: E731
    return {"changes": len(out), "p50_s": pick(0.5), "p99_s": pick(0.99), "max_s": round(out[-1], 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--new-rows", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--backfill", action="store_true", help="re-snapshot a streamed bench.b instead of adding it")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="mysqlcdc-bench-add-"))
    server = MariaDBServer()
    server.start()
    spark = build_spark_session("mysqlcdc-bench-add-table", master="local[2]")
    proc = None
    try:
        server.execute("CREATE DATABASE bench")
        server.execute(
            "CREATE TABLE a (id INT PRIMARY KEY, v BIGINT NOT NULL, s VARCHAR(60))",
            f"INSERT INTO a SELECT seq, seq, RPAD('a', 50, 'x') FROM seq_1_to_{args.rows}",
            "CREATE TABLE b (id INT PRIMARY KEY, v INT, s VARCHAR(100))",
            f"INSERT INTO b SELECT seq, seq, RPAD(CONCAT('b', seq), 90, 'y') FROM seq_1_to_{args.new_rows}",
            database="bench",
        )
        settings = server.cdc_settings()
        roots = {"sink_root": str(work / "lake"), "state_root": str(work / "state")}
        store = StateStore(roots["state_root"], "add")
        sink = DeltaSink(roots["sink_root"], owner="add")

        def run_plan(tables: list[str], plan_id: str, resnapshot: list[str] | None = None) -> None:
            config = PipelineConfig.from_params(pipeline_id="add", tables=tables, chunk_size=100_000,
                                                chunks_per_task=8, resnapshot_tables=resnapshot or [],
                                                **roots)  # fmt: skip
            with settings.connect() as conn:
                outcome = plan_run(conn, store, config, plan_id, sink.exists, table_owner=sink.owner_of)
            for g in outcome.groups:
                run_snapshot_group(spark, settings, store, plan_id, g["group_id"], DeltaSink(roots["sink_root"],
                                   owner="add"))  # fmt: skip

        run_plan(["bench.a", "bench.b"] if args.backfill else ["bench.a"], "p1")
        finalize_run(store, sink, "p1")
        run_id = uuid.uuid4().hex[:12]
        env = dict(os.environ, MYSQLCDC_SOURCE=json.dumps(settings.to_dict()), PYSPARK_PYTHON=sys.executable)
        cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
               "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
               "--jars", "/usr/share/java/mariadb-java-client.jar", str(JOB), "--state-root", roots["state_root"],
               "--pipeline-id", "add", "--sink-root", roots["sink_root"], "--run-id", run_id,
               "--trigger-seconds", "0.5"]  # fmt: skip
        proc = launch_detached(store, cmd, env, run_id)["_proc"]
        while (store.read_json(RUN) or {}).get("state") != "running":
            assert proc.poll() is None, "the stream died at start"
            time.sleep(0.2)

        writer = Writer(server, args.rows, args.rate, args.new_rows if args.backfill else 0)
        poller = Poller(sink.table_uri("bench.a"))
        writer.start()
        poller.start()
        time.sleep(30)  # the first batches warm the stream's Python workers up; "before" is the last 15 s
        t_plan = time.time()
        run_plan(["bench.a", "bench.b"], "p2", ["bench.b"] if args.backfill else None)
        t_final = time.time()
        out = finalize_run(store, sink, "p2")
        t_resumed = time.time()
        time.sleep(10)
        writer.stop_event.set()
        writer.join()
        with settings.connect() as conn:
            wait_until_applied(store, current_offset(conn), timeout=300)
        time.sleep(1)
        poller.stop_event.set()
        poller.join()
        matches = {}
        with settings.connect() as conn:
            for t in ("bench.a", "bench.b"):
                matches[t] = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t)).match
        result = {
            "mode": "backfill" if args.backfill else "add_table",
            "rows_streamed_table": args.rows, "rows_added_table": args.new_rows, "write_rate": args.rate,
            "snapshot_of_new_table_s": round(t_final - t_plan, 1),
            "handover_s": round(t_resumed - t_final, 2),
            "reloaded": out.reloaded, "new_generation": out.new_generation,
            "lag_before": _lags(writer.committed, poller.seen, t_plan - 15, t_plan),
            "lag_during_snapshot": _lags(writer.committed, poller.seen, t_plan, t_final),
            "lag_around_handover": _lags(writer.committed, poller.seen, t_final, t_resumed + 10),
            "lag_throughout": _lags(writer.committed, poller.seen, t_plan - 15, t_resumed + 10),
            "sinks_match_sources": matches,
        }
        log.info("%s", result)
        print(json.dumps(result))
        return 0
    finally:
        try:
            request_stop(StateStore(str(work / "state"), "add"), timeout=120)
        except Exception as exc:
            log.warning("stop failed: %s", exc)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        spark.stop()
        server.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
