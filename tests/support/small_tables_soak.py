"""A soak of the real stream over small tables under a writer: routed shards and plain small tables.

The case of issue 33 (item 2): small tables — below ``rewrite_below_mb`` — under a steady writer,
each changed in most micro-batches, at the stream's default settings. The pipeline is planned,
snapshotted and finalized as a DAG run does (``pipeline.plan_run`` / ``finalize_run``, with a route),
then the stream runs as the stream job runs it (``run_stream`` in a thread, ``StreamOptions`` as
given) for ``minutes`` while a writer changes the tables. A sampler measures the lake on disk against
its live data all along and right after each maintenance round the stream reports; at the end the
writer stops, the stream catches up and runs one more round, and every table is compared with its
source. Used by ``bench/soak.py --scenario small-tables``.

Tables: ``SHARDS`` routed shards ``soak_s<i>.orders`` (one Delta table ``soak.orders``, ~1.6 MB of
Parquet each) and three plain small tables with an integer, a composite and a string key.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from tests.support.mariadb import MariaDBServer
from tests.support.stream_thread import StreamThread
from tests.support.verify import compare

log = logging.getLogger(__name__)

SHARDS = 4
SHARD_ROWS = 32_000  # ~1.6 MB of Parquet per shard, as the report's shards
TARGET = "soak.orders"
PLAIN = {  # table -> (definition, initial rows as one INSERT ... SELECT over seq_1_to_<n>)
    "soak.items": ("(id BIGINT NOT NULL PRIMARY KEY, qty INT NOT NULL, note VARCHAR(64))",
                   "SELECT seq, seq % 97, MD5(seq) FROM seq_1_to_8000"),
    "soak.prices": ("(sku VARCHAR(16) NOT NULL, region SMALLINT NOT NULL, price DECIMAL(10,2), "
                    "PRIMARY KEY (sku, region))",
                    "SELECT CONCAT('sku-', seq DIV 4), seq % 4, seq / 7 FROM seq_1_to_3000"),
    "soak.tags": ("(tag VARCHAR(32) NOT NULL PRIMARY KEY, n INT NOT NULL)",
                  "SELECT CONCAT('tag-', LEFT(MD5(seq), 12)), seq FROM seq_1_to_500"),
    # one row changed every few seconds once the writer stopped: a stream only maintains its tables
    # between batches, so a source without any change would never reach its next maintenance round
    "soak.beat": ("(id INT NOT NULL PRIMARY KEY, n BIGINT NOT NULL)", "SELECT seq, 0 FROM seq_1_to_1"),
}  # fmt: skip


def shard_names() -> list[str]:
    return [f"soak_s{i}.orders" for i in range(SHARDS)]


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _create(server: MariaDBServer) -> None:
    server.execute("CREATE DATABASE IF NOT EXISTS soak")
    for i, shard in enumerate(shard_names()):
        db = shard.split(".")[0]
        server.execute(f"CREATE DATABASE IF NOT EXISTS {db}")
        server.execute(
            "CREATE TABLE orders (id BIGINT NOT NULL PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, "
            "note VARCHAR(80), created DATETIME(6) NOT NULL)",
            f"INSERT INTO orders SELECT seq, seq / 100 + {i}, CONCAT(MD5(seq), MD5(seq + {i})), "
            f"TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq SECOND FROM seq_1_to_{SHARD_ROWS}",
            database=db,
        )
    for table, (definition, rows) in PLAIN.items():
        name = table.split(".")[1]
        server.execute(f"CREATE TABLE {name} {definition}", f"INSERT INTO {name} {rows}", database="soak")


class SmallTableWriter(threading.Thread):
    """About ``rate`` transactions a second, each 1-3 changes of one table: the shards take most of
    them (the report's hot routed table), the plain tables the rest; 60% updates, 20% inserts, 20%
    deletes, over a key range that keeps every table's size about steady."""

    def __init__(self, server: MariaDBServer, rate: float, seed: int = 5):
        super().__init__(daemon=True)
        self.server, self.rate, self.rnd = server, rate, random.Random(seed)
        self.stop_event = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def _change(self, cur: Any) -> None:
        r, pick = self.rnd.random(), self.rnd.random()
        if pick < 0.7:
            db = f"soak_s{self.rnd.randrange(SHARDS)}"
            k = self.rnd.randint(1, SHARD_ROWS + SHARD_ROWS // 10)
            if r < 0.6:
                cur.execute(f"UPDATE {db}.orders SET amount = amount + 1, note = MD5(RAND()) WHERE id = {k}")
            elif r < 0.8:
                cur.execute(f"INSERT IGNORE INTO {db}.orders VALUES ({k}, {k} / 100, MD5(RAND()), NOW(6))")
            else:
                cur.execute(f"DELETE FROM {db}.orders WHERE id = {k}")
        elif pick < 0.85:
            k = self.rnd.randint(1, 8800)
            if r < 0.6:
                cur.execute(f"UPDATE soak.items SET qty = qty + 1, note = MD5(RAND()) WHERE id = {k}")
            elif r < 0.8:
                cur.execute(f"INSERT IGNORE INTO soak.items VALUES ({k}, 1, MD5(RAND()))")
            else:
                cur.execute(f"DELETE FROM soak.items WHERE id = {k}")
        elif pick < 0.95:
            sku, region = f"sku-{self.rnd.randint(0, 800)}", self.rnd.randrange(4)
            if r < 0.8:
                cur.execute("INSERT INTO soak.prices VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE price = VALUES(price)",
                            (sku, region, round(self.rnd.random() * 1000, 2)))  # fmt: skip
            else:
                cur.execute("DELETE FROM soak.prices WHERE sku = %s AND region = %s", (sku, region))
        else:
            tag = f"tag-{self.rnd.randrange(600):012x}"
            if r < 0.8:
                cur.execute("INSERT INTO soak.tags VALUES (%s, 1) ON DUPLICATE KEY UPDATE n = n + 1", (tag,))
            else:
                cur.execute("DELETE FROM soak.tags WHERE tag = %s", (tag,))

    def run(self) -> None:
        conn = self.server.root_connection("soak")
        conn.autocommit(False)
        started = time.monotonic()
        try:
            with conn.cursor() as cur:
                while not self.stop_event.is_set():
                    for _ in range(self.rnd.randint(1, 3)):
                        self._change(cur)
                    conn.commit()
                    self.transactions += 1
                    ahead = self.transactions / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        self.stop_event.wait(ahead)
        except BaseException as exc:  # the soak reports it
            self.error = exc
            conn.rollback()
        finally:
            conn.close()


def lake_tables(sink: DeltaSink) -> list[str]:
    """The Delta tables of the soak (the routed target once)."""
    return [TARGET, *PLAIN]


def live_bytes(sink: DeltaSink) -> int:
    """Bytes of the data files the lake's current versions hold (deletion vectors' files left out)."""
    total = 0
    for t in lake_tables(sink):
        actions = pa.table(DeltaTable(sink.table_uri(t)).get_add_actions(flatten=True))
        total += int(sum(actions.column("size_bytes").to_pylist()))
    return total


class _Sampler(threading.Thread):
    """Disk and live bytes every ``every`` seconds, and right after each maintenance round."""

    def __init__(self, store: StateStore, sink: DeltaSink, every: float):
        super().__init__(daemon=True)
        self.store, self.sink, self.every = store, sink, every
        self.stop_event = threading.Event()
        self.samples: list[dict[str, Any]] = []
        self.after_rounds: list[dict[str, Any]] = []
        self._round_at: float | None = None
        self.t0 = time.monotonic()

    def measure(self) -> dict[str, Any]:
        disk = _dir_bytes(self.sink.root)
        live = live_bytes(self.sink)
        return {"t": round(time.monotonic() - self.t0, 1), "disk": disk, "live": live,
                "ratio": round(disk / max(1, live), 2)}  # fmt: skip

    def run(self) -> None:
        next_at = 0.0
        while not self.stop_event.wait(0.5):
            try:
                at = (self.store.read_status().maintenance or {}).get("at")
                if at is not None and at != self._round_at:
                    self._round_at = at
                    self.after_rounds.append(self.measure())
                if time.monotonic() >= next_at:
                    self.samples.append(self.measure())
                    next_at = time.monotonic() + self.every
            except Exception as exc:  # a file vacuumed while listed: the next reading counts
                log.debug("sample failed: %s", exc)


def _setup(server: MariaDBServer, spark: Any, work: Path) -> tuple[StateStore, DeltaSink]:
    _create(server)
    settings = server.cdc_settings()
    store, sink = StateStore(str(work / "state"), "soak"), DeltaSink(str(work / "lake"), owner="soak")
    config = PipelineConfig.from_params(
        pipeline_id="soak", sink_root=sink.root, state_root=store.state_root,
        tables=[*shard_names(), *PLAIN], routes=[{"source": r"soak_s[0-9]+\.orders", "target": TARGET}],
        chunk_size=50_000, chunks_per_task=8,
    )  # fmt: skip
    with settings.connect() as conn:
        outcome = plan_run(conn, store, config, "p1", DeltaSink(sink.root, routes=config.routing).exists)
    for g in outcome.groups:
        run_snapshot_group(spark, settings, store, "p1", g["group_id"], sink)
    finalize_run(store, sink, "p1")
    return store, sink


def run_small_tables_soak(server: MariaDBServer, spark: Any, work: Path, minutes: float,
                          options: StreamOptions | None = None, rate: float = 20.0,
                          sample_every: float = 15.0) -> dict[str, Any]:  # fmt: skip
    """Run the soak (module doc); the figures as a dict."""
    store, sink = _setup(server, spark, work)
    settings = server.cdc_settings()
    options = options or StreamOptions()
    stream = StreamThread(spark, settings, store, sink, run_id="soak", options=options).start_running()
    sampler = _Sampler(store, sink, sample_every)
    writer = SmallTableWriter(server, rate)
    out: dict[str, Any] = {"minutes": minutes, "rate": rate}
    try:
        assert stream.error is None, stream.error
        sampler.start()
        out["at_start"] = sampler.measure()
        writer.start()
        deadline = time.monotonic() + minutes * 60
        while time.monotonic() < deadline and writer.is_alive() and stream.is_alive():
            time.sleep(1)
        writer.stop_event.set()
        writer.join(timeout=60)
        if writer.error is not None:
            raise RuntimeError(f"the writer failed: {writer.error}")
        stream.wait_applied(settings)
        out["writer_transactions"] = writer.transactions
        out["before_maintenance"] = sampler.measure()
        rounds = len(sampler.after_rounds)
        wait_until = time.monotonic() + options.maintenance.interval_seconds + 120
        while len(sampler.after_rounds) == rounds and time.monotonic() < wait_until and stream.is_alive():
            server.execute("UPDATE beat SET n = n + 1", database="soak")  # batches, so the next round comes
            time.sleep(3)
        out["after_maintenance"] = sampler.after_rounds[-1] if len(sampler.after_rounds) > rounds else None
        stream.wait_applied(settings)
    finally:
        writer.stop_event.set()
        sampler.stop_event.set()
        stream.stop_event.set()
        stream.join(timeout=300)
    if stream.error is not None:
        raise RuntimeError(f"the stream failed: {stream.error}")
    out["after_rounds"] = sampler.after_rounds
    out["peak_ratio"] = max((s["ratio"] for s in sampler.samples), default=None)
    out["samples"] = sampler.samples
    out["tables"] = _table_figures(sink)
    differences = {}
    with settings.connect() as conn:
        from airflow_provider_mysqlcdc.core.table import TableId
        from airflow_provider_mysqlcdc.mysql.schema import read_table_schema

        for t in [*shard_names(), *PLAIN]:
            cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
            if not cmp.match:
                differences[t] = cmp.first_difference
    out["sink_matches_source"] = not differences
    out["differences"] = differences
    return out


def _table_figures(sink: DeltaSink) -> dict[str, Any]:
    """Per Delta table: version, live files and bytes, bytes on disk, whether it has deletion vectors."""
    out = {}
    for t in lake_tables(sink):
        dt = DeltaTable(sink.table_uri(t))
        sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
        protocol = dt.protocol()
        out[t] = {"version": dt.version(), "files": len(sizes), "live_bytes": int(sum(sizes)),
                  "disk_bytes": _dir_bytes(sink.table_uri(t)),
                  "deletion_vectors": "deletionVectors" in (protocol.reader_features or [])}  # fmt: skip
    return out


__all__ = ["SHARDS", "SmallTableWriter", "lake_tables", "live_bytes", "run_small_tables_soak", "shard_names"]
