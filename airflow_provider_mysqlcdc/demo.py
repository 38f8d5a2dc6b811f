"""The embedded end-to-end demo behind ``make demo``.

Starts a private MariaDB with a ROW binlog (never the one on 3306), loads a small shop schema
(~1M rows in four tables: integer, composite and case-insensitive VARCHAR keys), runs the source
check, plans the chunks, snapshots every split group with Spark ``local[*]`` into Delta tables
under ``.demo/lake`` — with a writer changing rows while the snapshot runs — and prints a
verification table comparing each Delta table with its source as of the snapshot.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default=".demo")
    p.add_argument("--scale", type=float, default=1.0, help="data size factor (1.0 = ~1M rows)")
    p.add_argument("--chunk-size", type=int, default=50_000)
    p.add_argument("--chunks-per-group", type=int, default=8)
    p.add_argument("--stream-seconds", type=float, default=15.0, help="how long the writer runs under the stream")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
    from airflow_provider_mysqlcdc.source.checks import check_source
    from airflow_provider_mysqlcdc.source.planner import plan_snapshot
    from airflow_provider_mysqlcdc.source.server import current_offset
    from airflow_provider_mysqlcdc.spark_session import build_spark_session
    from airflow_provider_mysqlcdc.state import StateStore
    from airflow_provider_mysqlcdc.stream.job import (
        MANIFEST,
        StreamOptions,
        start_stream,
        stop_gracefully,
        wait_until_caught_up,
    )
    from airflow_provider_mysqlcdc.stream.manifest import build_manifest
    from airflow_provider_mysqlcdc.testing.mariadb import MariaDBServer
    from airflow_provider_mysqlcdc.verify import compare

    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    server = MariaDBServer(work / "mariadb")
    print(f"starting a private MariaDB with a ROW binlog in {work / 'mariadb'} ...", flush=True)
    server.start()
    spark = None
    try:
        t = time.monotonic()
        counts = load_schema(server, args.scale)
        print(f"loaded demo schema: {counts} in {time.monotonic() - t:.1f}s", flush=True)
        settings = server.cdc_settings()
        with settings.connect() as conn:
            report = check_source(conn, TABLES)
            print(report.summary(), flush=True)
            if not report.ok:
                return 1
            plan = plan_snapshot(conn, TABLES, args.chunk_size, args.chunks_per_group)
        print(f"plan: {len(plan.splits)} chunks in {len(plan.groups)} split groups ({plan.methods})", flush=True)
        store = StateStore(str(work / "state"), "demo")
        store.write_plan("p1", plan.to_dict())
        sink = DeltaSink(str(work / "lake"))
        spark = build_spark_session("mysqlcdc-demo", master="local[*]")

        writer = DemoWriter(server)
        writer.start()
        t0 = time.monotonic()
        results = []
        for g in plan.groups:
            results.append(run_snapshot_group(spark, settings, store, "p1", g.group_id, sink))
        secs = time.monotonic() - t0
        rows = sum(r.rows for r in results)
        print(
            f"snapshot: {rows} rows in {secs:.1f}s = {rows / secs:,.0f} rows/s into Delta, while a writer ran "
            f"{writer.transactions} transactions "
            f"({sum(r.window_changes for r in results)} replayed from binlog windows)",
            flush=True,
        )
        manifest = build_manifest(plan, store.read_all_results("p1"))
        store.write_json(MANIFEST, manifest)
        print(f"stream: starting from the minimum high watermark {manifest['start_offset']}", flush=True)
        query = start_stream(spark, settings, store, sink, StreamOptions(trigger_seconds=0.5))
        try:
            time.sleep(args.stream_seconds)  # the writer keeps writing while the stream runs
            writer.stop_event.set()
            writer.join()
            with settings.connect() as conn:
                target = current_offset(conn)
            t1 = time.monotonic()
            wait_until_caught_up(query, target)
            status = store.read_json("stream/status.json") or {}
            print(
                f"stream: caught up with {target} {time.monotonic() - t1:.1f}s after the writer stopped "
                f"({writer.transactions} writer transactions in all); last batch lag {status.get('lag_seconds')}s",
                flush=True,
            )
        finally:
            stop_gracefully(query)
        print(f"\n{'table':<20} {'source rows':>12} {'sink rows':>12}  checksum match")
        ok = True
        with settings.connect() as conn:
            for t in TABLES:
                cmp = compare(conn, plan.tables[t], sink.read(t))
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
            f"The pipeline state (plan, chunk results, stream manifest and checkpoint) is in {work / 'state'}.\n"
            "Everything the demo started has been stopped.",
            flush=True,
        )
        return 0 if ok else 1
    finally:
        if spark is not None:
            spark.stop()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
