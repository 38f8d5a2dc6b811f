"""Sharded tables routed into one Delta table (docs/architecture.md, "Routing sharded tables").

Eight shards ``<db>_s0..3.orders_0..1`` with the same keys in every shard are routed to
``<db>.orders`` while a writer changes them (one transaction often changes one key in two shards).
They are snapshotted (several chunks and groups per shard, committed into the one table),
streamed, and meanwhile: a large transaction on one shard goes through the bounded rewrite, a
ninth shard is created (captured from its CREATE into the same table), one shard gets an ADD
COLUMN (the others' rows read NULL there until theirs), and one shard is re-snapshotted while the
stream runs (swapped into its partition only). Afterwards the routed table equals the union of
the shards with their source columns, and each shard equals its source.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
from airflow_provider_mysqlcdc.plan_rules import PipelineStateError
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from airflow_provider_mysqlcdc.verify import verify_pipeline
from tests.support.stream_thread import StreamThread
from tests.support.verify import assert_sink_equals_source, source_table

ROWS = 300
TABLE = "(id BIGINT NOT NULL PRIMARY KEY, amount DECIMAL(10,2), note VARCHAR(24))"


def _shards(db: str) -> list[tuple[str, str]]:
    return [(f"{db}_s{d}", f"orders_{t}") for d in range(4) for t in range(2)]


class ShardWriter(threading.Thread):
    """Random single-row changes over the shards, and transactions changing one key in two shards."""

    def __init__(self, mariadb: Any, shards: list[tuple[str, str]]):
        super().__init__(daemon=True)
        self.mariadb, self.shards = mariadb, list(shards)
        self.stop_event, self.lock = threading.Event(), threading.Lock()
        self.rnd = random.Random(11)
        self.transactions = 0
        self.error: Exception | None = None

    def _change(self, cur: Any, db: str, t: str, k: int) -> None:
        r = self.rnd.random()
        if r < 0.2:
            cur.execute(f"DELETE FROM `{db}`.`{t}` WHERE id = {k}")
        elif r < 0.45:
            cur.execute(f"INSERT IGNORE INTO `{db}`.`{t}` (id, amount, note) VALUES ({k}, {k}.25, 'new-{t[-1]}')")
        else:
            cur.execute(f"UPDATE `{db}`.`{t}` SET amount = amount + 1, note = 'u{k}' WHERE id = {k}")

    def run(self) -> None:
        conn = self.mariadb.root_connection(self.shards[0][0])
        conn.autocommit(False)
        try:
            with conn.cursor() as cur:
                while not self.stop_event.is_set():
                    with self.lock:
                        k = self.rnd.randint(1, ROWS + 40)
                        picked = self.rnd.sample(self.shards, 2 if self.rnd.random() < 0.4 else 1)
                        for db, t in picked:  # the same key in two shards, in one transaction
                            self._change(cur, db, t, k)
                        conn.commit()
                        self.transactions += 1
                    time.sleep(0.003)
        except Exception as exc:  # the test reads it; the open transaction must not hold its locks
            self.error = exc
            conn.rollback()
        finally:
            conn.close()


@pytest.fixture
def shard_dbs(mariadb: Any, db: str) -> Any:
    """Makes databases named after ``db`` (the shards'), dropped after the test."""
    made: list[str] = []

    def make(*names: str) -> None:
        for d in names:
            mariadb.execute(f"DROP DATABASE IF EXISTS `{d}`", f"CREATE DATABASE `{d}`")
            made.append(d)

    yield make
    for d in made:
        mariadb.execute(f"DROP DATABASE IF EXISTS `{d}`")


def _routed_rows(sink: DeltaSink, target: str) -> pa.Table:
    db, _, name = target.partition(".")
    dt = DeltaTable(f"{sink.root}/{db}/{name}")
    rows = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    return rows.cast(pa.schema(dt.schema().to_arrow()))


def _expected_union(settings: Any, shards: list[tuple[str, str]], columns: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with settings.connect() as conn:
        for db, t in shards:
            rows = source_table(conn, read_table_schema(conn, TableId(db, t))).to_pylist()
            out += [{"_source_database": db, "_source_table": t, **{c: r.get(c) for c in columns}} for r in rows]
    return sorted(out, key=lambda r: (r["_source_database"], r["_source_table"], r["id"]))


@pytest.mark.xfail(
    strict=False,
    reason="open bug (issue 34 note, present at 2316cb1): the shard whose ADD COLUMN the stream follows can lose "
    "its snapshot rows (after the snapshot every partition is whole; after streaming ~20 of ~250 rows remain); "
    "intermittent, most often after other pipelines ran in the process",
)
def test_shards_routed_into_one_table_under_writes(
    mariadb: Any, db: str, shard_dbs: Any, cdc_settings: Any, spark: Any, tmp_path: Any
) -> None:
    shards = _shards(db)
    shard_dbs(*sorted({d for d, _ in shards}))
    for i, (d, t) in enumerate(shards):
        mariadb.execute(f"CREATE TABLE `{t}` {TABLE}",  # the same keys 1..ROWS in every shard
                        f"INSERT INTO `{t}` SELECT seq, seq + {i} / 100, CONCAT('s{i}-', seq) FROM seq_1_to_{ROWS}",
                        database=d)  # fmt: skip
    target = f"{db}.orders"
    store, sink = StateStore(str(tmp_path / "state"), "routed"), DeltaSink(str(tmp_path / "lake"), owner="routed")
    params: dict[str, Any] = dict(
        pipeline_id="routed", sink_root=sink.root, state_root=store.state_root, tables=[f"{db}_s*.orders_*"],
        routes=[{"source": rf"{db}_s[0-9]+\.orders_[0-9]+", "target": target}], chunk_size=100, chunks_per_task=8,
    )  # fmt: skip
    writer = ShardWriter(mariadb, shards)
    writer.start()  # writing during the snapshot: each group's window replay goes into the shared table
    with cdc_settings.connect() as conn:
        outcome = plan_run(conn, store, PipelineConfig.from_params(**params), "p1", DeltaSink(
            sink.root, routes=PipelineConfig.from_params(**params).routing).exists)  # fmt: skip
    assert any(f"route {target}: 8 table(s)" in n for n in outcome.notes), outcome.notes
    assert len(outcome.groups) >= 3
    for g in outcome.groups:
        run_snapshot_group(spark, cdc_settings, store, "p1", g["group_id"], sink)
    finalize_run(store, sink, "p1")
    manifest = store.read_manifest()
    assert {e.routed_to for e in manifest.tables.values()} == {target}
    assert not DeltaTable.is_deltatable(f"{sink.root}/{db}_s0/orders_0")  # no table of its own

    # small inline blocks: the large transaction below is staged and applied by the bounded rewrite
    opts = StreamOptions(trigger_seconds=0.5, schema_change_policy="lenient", max_inline_bytes=16_384)
    th = StreamThread(spark, cdc_settings, store, sink, run_id="routed-1", options=opts).start_running()
    try:
        time.sleep(2)
        with writer.lock:
            mariadb.execute("UPDATE orders_1 SET note = CONCAT(note, '-big')", database=shards[2][0])
        new_shard = (f"{db}_s3", "orders_7")
        with writer.lock:  # a shard created while streaming: captured from its CREATE, into the same table
            mariadb.execute(f"CREATE TABLE orders_7 {TABLE}",
                            "INSERT INTO orders_7 SELECT seq, seq, 'seven' FROM seq_1_to_50", database=new_shard[0])
            writer.shards.append(new_shard)
        time.sleep(2)
        with writer.lock:  # one shard's ADD COLUMN: followed; the other shards' rows read NULL there
            mariadb.execute("ALTER TABLE orders_0 ADD COLUMN channel VARCHAR(8)",
                            "INSERT INTO orders_0 (id, amount, note, channel) VALUES (1000, 1, 'c', 'app')",
                            database=shards[0][0])  # fmt: skip
        time.sleep(2)
        # one shard re-snapshotted while the stream runs: swapped into its own partition only
        params["resnapshot_tables"] = [f"{shards[5][0]}.{shards[5][1]}"]
        config = PipelineConfig.from_params(**params)
        with cdc_settings.connect() as conn:
            again = plan_run(conn, store, config, "p2", DeltaSink(sink.root, routes=config.routing).exists)
        for g in again.groups:
            run_snapshot_group(spark, cdc_settings, store, "p2", g["group_id"], sink)
        finalize_run(store, sink, "p2")
        time.sleep(2)
        writer.stop_event.set()
        writer.join(timeout=30)
        assert writer.error is None and writer.transactions > 200, writer.error
        th.wait_applied(cdc_settings)
        assert th.error is None, th.error

        every = [*shards, new_shard]
        assert f"{new_shard[0]}.{new_shard[1]}" in store.read_manifest().tables
        for d, t in every:  # each shard's partition equals its source
            assert_sink_equals_source(cdc_settings, sink, f"{d}.{t}")
        routed = _routed_rows(sink, target)
        assert routed.schema.names[:2] == list(SOURCE_COLUMNS) and "channel" in routed.schema.names
        columns = [c for c in routed.schema.names if c not in SOURCE_COLUMNS]
        got = sorted(routed.to_pylist(), key=lambda r: (r["_source_database"], r["_source_table"], r["id"]))
        want = _expected_union(cdc_settings, every, columns)
        assert len(got) == len(want) and got == want
        per_key = Counter(r["id"] for r in got)
        assert max(per_key.values()) >= 8  # one key, one row per shard
        report = verify_pipeline(cdc_settings, store, sink, wait_timeout=120)
        assert report.ok, report.summary()
    finally:
        writer.stop_event.set()
        th.stop_event.set()
        th.join(timeout=120)


def test_plan_refuses_shards_that_differ_naming_the_columns(mariadb: Any, db: str, shard_dbs: Any, cdc_settings: Any,
                                                           tmp_path: Any) -> None:  # fmt: skip
    shard_dbs(f"{db}_r0", f"{db}_r1")
    mariadb.execute(f"CREATE TABLE orders {TABLE}", database=f"{db}_r0")
    mariadb.execute("CREATE TABLE orders (id BIGINT NOT NULL PRIMARY KEY, amount DOUBLE, note VARCHAR(24), x INT)",
                    database=f"{db}_r1")  # fmt: skip
    config = PipelineConfig.from_params(
        pipeline_id="refused", sink_root=str(tmp_path / "lake"), state_root=str(tmp_path / "state"),
        tables=[f"{db}_r?.orders"], routes=[{"source": f"{db}_r?.orders", "target": f"{db}.all_orders"}],
    )  # fmt: skip
    store = StateStore(str(tmp_path / "state"), "refused")
    with cdc_settings.connect() as conn, pytest.raises(PipelineStateError) as err:
        plan_run(conn, store, config, "p1", lambda t: False)
    text = str(err.value)
    assert f"{db}.all_orders" in text and "amount: decimal128(10, 2)" in text and "double" in text, text
    assert "x:" not in text  # a column only one shard has is not a conflict (NULL in the other's rows)
    assert not store.exists("plans/p1")
