"""The embedded end-to-end demo behind ``make demo``.

Starts a private MariaDB with a ROW binlog (never the one on 3306), loads a small shop schema
(~1M rows in four tables: integer, composite and case-insensitive VARCHAR keys), runs the source
runs the example DAG ``mysql_cdc`` with ``airflow dags test`` (plan, mapped snapshot tasks with
Spark ``local[*]``, the detached binlog stream, the catch-up sensor) into Delta tables under
``.demo/lake`` while a writer changes rows, lets the writer run on under the stream, waits for the
stream to catch up and prints a verification table comparing each Delta table with its source.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("mysqlcdc.demo")

TABLES = ["shop.customers", "shop.products", "shop.orders", "shop.order_items"]


def load_schema(server: object, scale: float) -> dict[str, int]:
    n_cust, n_prod, n_ord = int(50_000 * scale), int(20_000 * scale), int(600_000 * scale)
    server.execute(  # type: ignore[attr-defined]
        "CREATE DATABASE shop",
        """CREATE TABLE shop.customers (
             id INT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL, email VARCHAR(128),
             tier ENUM('free','pro','enterprise') NOT NULL, created DATETIME(6) NOT NULL)""",
        """CREATE TABLE shop.products (
             sku VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL, price DECIMAL(10,2) NOT NULL,
             attrs JSON) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci""",
        """CREATE TABLE shop.orders (
             id BIGINT NOT NULL PRIMARY KEY, customer_id INT NOT NULL, amount DECIMAL(12,2) NOT NULL,
             status ENUM('new','paid','shipped','cancelled') NOT NULL, created DATETIME(6) NOT NULL,
             note VARCHAR(200))""",
        """CREATE TABLE shop.order_items (
             order_id BIGINT NOT NULL, line INT NOT NULL, sku VARCHAR(32) NOT NULL, qty INT NOT NULL,
             PRIMARY KEY (order_id, line))""",
    )
    server.execute(  # type: ignore[attr-defined]
        f"""INSERT INTO customers SELECT seq, CONCAT('Customer ', seq), CONCAT('c', seq, '@example.com'),
              ELT(1 + seq % 3, 'free', 'pro', 'enterprise'), TIMESTAMP('2025-01-01') + INTERVAL seq MINUTE
            FROM seq_1_to_{n_cust}""",
        f"""INSERT INTO products SELECT CONCAT(IF(seq % 2, 'sku-', 'SKU-'), LPAD(seq, 6, '0')),
              CONCAT('Product ', seq), (seq % 10000) / 100 + 1,
              JSON_OBJECT('color', ELT(1 + seq % 3, 'red', 'green', 'blue'))
            FROM seq_1_to_{n_prod}""",
        f"""INSERT INTO orders SELECT seq, 1 + seq % {n_cust}, (seq % 100000) / 100, ELT(1 + seq % 4, 'new', 'paid',
              'shipped', 'cancelled'),
              TIMESTAMP('2025-06-01') + INTERVAL seq SECOND + INTERVAL seq % 999999 MICROSECOND,
              IF(seq % 5 = 0, NULL, CONCAT('order note ', seq))
            FROM seq_1_to_{n_ord}""",
        f"""INSERT INTO order_items SELECT 1 + seq DIV 3 * 1, 1 + seq % 3,
              CONCAT(IF(seq % 2, 'sku-', 'SKU-'), LPAD(1 + seq % {n_prod}, 6, '0')), 1 + seq % 5
            FROM seq_0_to_{int(n_ord * 0.55) - 1}""",
        "ANALYZE TABLE customers, products, orders, order_items",
        database="shop",
    )
    return {t: int(server.query(f"SELECT COUNT(*) FROM {t}")[0][0]) for t in TABLES}  # type: ignore[attr-defined]


class DemoWriter(threading.Thread):
    """Random inserts, updates, deletes and key moves, ~``rate`` transactions per second."""

    def __init__(self, server: object, rate: float = 100.0):
        super().__init__(daemon=True)
        self.server, self.rate = server, rate
        self.stop_event = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        rnd = random.Random(42)
        conn = self.server.root_connection("shop")  # type: ignore[attr-defined]
        cur = conn.cursor()
        t0 = time.monotonic()
        next_order = 10_000_000
        while not self.stop_event.is_set():
            r = rnd.random()
            oid = rnd.randint(1, 600_000)
            if r < 0.5:
                cur.execute("UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id = %s", (oid,))
            elif r < 0.65:
                cur.execute("INSERT INTO orders VALUES (%s, 1, 9.99, 'new', NOW(6), 'demo writer')", (next_order,))
                next_order += 1
            elif r < 0.75:
                cur.execute("DELETE FROM orders WHERE id = %s", (oid,))
            elif r < 0.85:
                cur.execute("UPDATE orders SET id = %s WHERE id = %s", (next_order, oid))  # a key move
                next_order += 1
            elif r < 0.95:
                cur.execute("UPDATE customers SET tier = 'pro' WHERE id = %s", (rnd.randint(1, 50_000),))
            else:
                cur.execute("UPDATE order_items SET qty = qty + 1 WHERE order_id = %s", (oid,))
            self.transactions += 1
            delay = t0 + self.transactions / self.rate - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
        conn.close()


def _airflow_env(work: Path, server: object, spark_master: str) -> dict[str, str]:
    from tests.support.airflow_env import airflow_environment

    env = {**os.environ, **airflow_environment(work / "airflow")}
    env["AIRFLOW_CONN_MYSQL_CDC_DEFAULT"] = server.airflow_conn_json()  # type: ignore[attr-defined]
    env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": spark_master})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


_SHOW = re.compile(
    r"(\[DAG TEST\] (starting|end) task|plan \S+:|snapshot group \d+ of plan|group \d+: \d+ chunks|"
    r"starting the stream|the stream runs|stopping the running stream|finalized|caught up|ERROR|error:|Failed|failed)"
)


def _run_dags_test(env: dict[str, str], conf: dict[str, object], log_path: Path) -> tuple[int, float, float]:
    """``airflow dags test mysql_cdc -c <conf>``, echoing the interesting lines; returns (rc, snapshot s, total s)."""
    cmd = [sys.executable, "-m", "airflow", "dags", "test", "mysql_cdc", "-c", json.dumps(conf)]
    print("running: airflow dags test mysql_cdc -c '" + json.dumps(conf) + "'", flush=True)
    t0 = time.monotonic()
    snap_start = snap_end = None
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            if "task_id=snapshot" in line and "[DAG TEST] starting" in line and snap_start is None:
                snap_start = time.monotonic()
            if "task_id=snapshot" in line and "[DAG TEST] end" in line:
                snap_end = time.monotonic()
            if _SHOW.search(line) and "running task" not in line:
                text = re.sub(r"\s+\[(airflow|py\.warnings)[^\]]*\].*$", "", line.rstrip())
                print("  " + re.sub(r"^\S+Z \[\w+\s*\] ", "", text)[:220], flush=True)
        rc = proc.wait()
    snap = (snap_end - snap_start) if snap_start and snap_end else 0.0
    return rc, snap, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default=".demo")
    p.add_argument("--scale", type=float, default=1.0, help="data size factor (1.0 = ~1M rows)")
    p.add_argument("--chunk-size", type=int, default=50_000)
    p.add_argument("--chunks-per-task", type=int, default=8)
    p.add_argument("--spark-master", default="local[*]")
    p.add_argument("--stream-seconds", type=float, default=15.0, help="how long the writer runs after the DAG run")
    p.add_argument(
        "--keep-running", action="store_true",
        help="leave MariaDB and the stream running at the end (stop them with 'make demo-stop')",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", stream=sys.stderr)

    from tests.support.airflow_env import airflow_environment

    work = Path(args.workdir).resolve()
    os.environ.update(airflow_environment(work / "airflow"))  # before anything imports Airflow

    from airflow_provider_mysqlcdc.core.table import TableId
    from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
    from airflow_provider_mysqlcdc.mysql.server import current_offset
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.state import StateStore
    from airflow_provider_mysqlcdc.stream.control import request_stop, stream_state, wait_until_applied
    from tests.support.mariadb import MariaDBServer
    from tests.support.verify import compare

    if (work / "mariadb" / "mysqld.pid").exists():
        _stop_leftovers(work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    server = MariaDBServer(work / "mariadb")
    minutes = max(1.0, 2.5 * args.scale + args.stream_seconds / 60)
    print(f"the demo takes about {minutes:.0f}-{minutes + 1:.0f} minutes on 2 cores (loading ~{args.scale:g}M rows, "
          "a snapshot in several Spark jobs, then the stream under a writer)", flush=True)  # fmt: skip
    print(f"starting a private MariaDB with a ROW binlog in {work / 'mariadb'} ...", flush=True)
    server.start()
    store = StateStore(str(work / "state"), "demo")
    keep = False
    try:
        t = time.monotonic()
        counts = load_schema(server, args.scale)
        print(f"loaded demo schema: {counts} in {time.monotonic() - t:.1f}s", flush=True)
        env = _airflow_env(work, server, args.spark_master)
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
        conf = {
            "pipeline_id": "demo",
            "tables": TABLES,
            "sink_root": str(work / "lake"),
            "state_root": str(work / "state"),
            "chunk_size": args.chunk_size,
            "chunks_per_task": args.chunks_per_task,
            "stream_mode": "detached",
        }
        writer = DemoWriter(server)
        writer.start()
        rc, snap_secs, total = _run_dags_test(env, conf, work / "airflow-dags-test.log")
        if rc != 0:
            writer.stop_event.set()
            print(f"the DAG run failed (exit {rc}); its log: {work / 'airflow-dags-test.log'}", flush=True)
            return 1
        plan_id = _last_plan(store)
        snap_rows = sum(r.rows for r in store.read_all_results(plan_id))
        n_groups = len(store.read_plan_record(plan_id).groups)
        in_job = sum(
            float(getattr(store.read_group_report(plan_id, g), "summary", {}).get("seconds", 0.0))
            for g in range(n_groups)
        )
        print(
            f"DAG run finished in {total:.0f}s; snapshot: {snap_rows:,} rows in {n_groups} mapped tasks, "
            f"{snap_rows / max(in_job, 1e-9):,.0f} rows/s inside the Spark jobs, "
            f"{snap_rows / max(snap_secs, 1e-9):,.0f} rows/s wall clock including each spark-submit's start-up "
            "(dags test runs mapped tasks one after another)",
            flush=True,
        )
        time.sleep(args.stream_seconds)  # the writer keeps writing while the detached stream runs
        writer.stop_event.set()
        writer.join()
        settings = server.cdc_settings()
        with settings.connect() as conn:
            target = current_offset(conn)
        t1 = time.monotonic()
        st = wait_until_applied(store, target, timeout=600)
        print(
            f"stream: caught up with {target} {time.monotonic() - t1:.1f}s after the writer stopped "
            f"({writer.transactions} writer transactions in all); last batch lag {st['lag_seconds']}s",
            flush=True,
        )
        print(f"\n{'table':<20} {'source rows':>12} {'sink rows':>12}  checksum match")
        ok = True
        sink = DeltaSink(str(work / "lake"))
        with settings.connect() as conn:
            for t in TABLES:
                cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
                ok &= cmp.match
                print(
                    f"{t:<20} {cmp.source_rows:>12} {cmp.sink_rows:>12}  {'yes' if cmp.match else 'NO'}"
                    + ("" if cmp.match else f"  ({cmp.first_difference})")
                )
        print(
            f"\nDelta tables are in {work / 'lake'}; query them with SQL (DataFusion, part of deltalake):\n"
            f'  .venv/bin/python -c "from deltalake import DeltaTable, QueryBuilder; '
            f"print(QueryBuilder().register('o', DeltaTable('{work / 'lake' / 'shop' / 'orders'}'))"
            f".execute('SELECT status, count(*) AS n FROM o GROUP BY status').read_all())\"\n"
            f"Pipeline status: .venv/bin/python -m airflow_provider_mysqlcdc status --pipeline demo "
            f"--state-root {work / 'state'}\n"
            f"Airflow's log of the DAG run: {work / 'airflow-dags-test.log'}; the stream's driver log: "
            f"{stream_state(store)['log_path']}",
            flush=True,
        )
        keep = args.keep_running and ok
        if keep:
            print(
                "\nMariaDB and the stream keep running. Stop everything with:  make demo-stop\n"
                f"  (= .venv/bin/python -m airflow_provider_mysqlcdc stop --pipeline demo --state-root {work / 'state'}"
                f" and kill $(cat {work / 'mariadb' / 'mysqld.pid'}))",
                flush=True,
            )
        return 0 if ok else 1
    finally:
        if not keep:
            request_stop(store, timeout=120)
            server.stop()
            print("stopped the stream (python -m airflow_provider_mysqlcdc stop) and the private MariaDB.", flush=True)


def _last_plan(store: object) -> str:
    pointer = store.read_plan_pointer()  # type: ignore[attr-defined]
    return str(None if pointer is None else pointer.plan_id)


def _stop_leftovers(work: Path) -> None:
    """A previous ``--keep-running`` demo: stop its stream and its MariaDB before starting afresh."""
    import signal

    from airflow_provider_mysqlcdc.state import StateStore
    from airflow_provider_mysqlcdc.stream.control import request_stop

    if (work / "state" / "demo").exists():
        request_stop(StateStore(str(work / "state"), "demo"), timeout=120)
    pid_file = work / "mariadb" / "mysqld.pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGTERM)
        for _ in range(120):
            os.kill(pid, 0)
            time.sleep(0.5)
    except (OSError, ValueError):
        pass


def stop_main() -> int:
    """``make demo-stop``: stop what ``make demo ARGS=--keep-running`` left running."""
    _stop_leftovers(Path(".demo").resolve())
    print("stopped the demo's stream and MariaDB", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--stop"]:
        sys.exit(stop_main())
    sys.exit(main())
