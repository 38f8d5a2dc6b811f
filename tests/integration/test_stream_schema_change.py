"""DDL while streaming: ALTER TABLE reaches the Delta table; unsupported DDL stops the stream, losing nothing.

The stream runs in this process (``run_stream`` in a thread, Spark local[2]) over a snapshotted
table. ``ADD COLUMN`` and a type widening are run between writes — some in the same micro-batch
as rows written before and after them — and the Delta table must then equal the source, column
for column (rows older than the ADD COLUMN read NULL there, as they do in the source). Under the
``fail`` policy a TRUNCATE must stop the stream with a message naming the fix, with every change
before it applied (every DDL under every policy: test_schema_policy.py).
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow.compute as pc
import pytest

from airflow_provider_mysqlcdc.core.changelog import order_key
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import read_changelog
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import MANIFEST, StateStore
from airflow_provider_mysqlcdc.stream.control import stream_state, wait_until_applied
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from airflow_provider_mysqlcdc.stream.schema_follow import SCHEMA_HISTORY, StreamSchemaError
from tests.support.stream_thread import StreamThread, snapshot_tables
from tests.support.verify import compare


def _equal(settings: Any, sink: DeltaSink, table: str) -> None:
    with settings.connect() as conn:
        cmp = compare(conn, read_table_schema(conn, TableId.parse(table)), sink.read(table))
    assert cmp.match, cmp


@pytest.fixture
def stream_policy() -> str:
    return "lenient"


@pytest.fixture
def streaming(mariadb: Any, db: str, cdc_settings: Any, spark: Any, tmp_path: Any,  # type: ignore[no-untyped-def]
              stream_policy: str):  # fmt: skip
    mariadb.execute(
        f"CREATE TABLE `{db}`.t (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, note VARCHAR(20))",
        f"INSERT INTO `{db}`.t SELECT seq, seq, CONCAT('n', seq) FROM seq_1_to_3000",
        database=db,
    )
    table = f"{db}.t"
    store, sink = StateStore(str(tmp_path / "state"), "ddl"), DeltaSink(str(tmp_path / "lake"))
    snapshot_tables(spark, cdc_settings, store, sink, [table], 500, 4)
    store.write_manifest(store.read_manifest().with_changelogs({table: True}))  # the changelog follows DDL too
    opts = StreamOptions(trigger_seconds=0.5, schema_change_policy=stream_policy)
    th = StreamThread(spark, cdc_settings, store, sink, run_id="schema-test-1", options=opts).start_running()
    yield mariadb, db, table, store, sink, th
    th.stop_event.set()
    th.join(timeout=120)


def _applied(cdc_settings: Any, store: StateStore, th: StreamThread) -> None:
    with cdc_settings.connect() as conn:
        target = current_offset(conn)
    deadline = time.monotonic() + 120
    while stream_state(store)["state"] == "starting" and time.monotonic() < deadline:
        time.sleep(0.2)
    th.recorder._last_beat = 0  # heartbeat now, not in 5 s
    wait_until_applied(store, target, timeout=180)


def test_add_column_and_widening_reach_the_delta_table(streaming: Any, cdc_settings: Any) -> None:
    mariadb, db, table, store, sink, th = streaming
    # One burst: rows before and after each DDL land in the same micro-batch.
    mariadb.execute(
        "UPDATE t SET v = v + 1 WHERE id <= 50",
        "ALTER TABLE t ADD COLUMN extra VARCHAR(10) NULL",
        "INSERT INTO t VALUES (5001, 1, 'new', 'x1'), (5002, 2, NULL, NULL)",
        "UPDATE t SET extra = 'set' WHERE id BETWEEN 100 AND 120",
        "DELETE FROM t WHERE id BETWEEN 200 AND 210",
        "ALTER TABLE t MODIFY v BIGINT NOT NULL",
        "UPDATE t SET v = 5000000000 + id WHERE id BETWEEN 300 AND 320",
        "INSERT INTO t VALUES (5003, 9000000000, 'big', 'x3')",
        database=db,
    )
    _applied(cdc_settings, store, th)
    assert th.error is None, th.error
    _equal(cdc_settings, sink, table)
    entry = store.read_json(MANIFEST)["tables"][table]
    assert entry["added_columns"] == ["extra"] and entry["schema_position"]
    delta = sink.read(table).schema
    assert str(delta.field("v").type) == "int64" and "extra" in delta.names

    mariadb.execute("UPDATE t SET extra = 'later', v = v * 2 WHERE id <= 10", database=db)
    _applied(cdc_settings, store, th)
    _equal(cdc_settings, sink, table)
    assert stream_state(store)["running"]
    # the changelog's images took the new column and the wider type; every change is in it once
    log = order_key(read_changelog(sink, table))
    after = log.schema.field("after").type
    assert str(after.field("v").type) == "int64" and after.get_field_index("extra") >= 0
    rows = log.to_pylist()
    assert [r["_op"] for r in rows].count("d") == 11 and len(rows) == 50 + 2 + 21 + 11 + 21 + 1 + 10
    assert rows[-1]["after"]["extra"] == "later" and rows[-1]["after"]["v"] == 2 * rows[-1]["before"]["v"]


def test_add_column_with_defaults_fills_existing_rows_and_older_images(streaming: Any, cdc_settings: Any) -> None:
    """The source gives the rows an ADD COLUMN ... DEFAULT finds its default with no row event: the
    lake's rows get it too, and so do images logged before the ALTER (replayed in its batch)."""
    mariadb, db, table, store, sink, th = streaming
    mariadb.execute(
        "UPDATE t SET v = v + 1 WHERE id <= 30",  # same micro-batch, logged before the ALTER
        "ALTER TABLE t ADD COLUMN channel VARCHAR(8) NOT NULL DEFAULT 'web', ADD COLUMN amount DECIMAL(8,2) "
        "DEFAULT 9.99, ADD COLUMN flag BIT(1) NOT NULL DEFAULT 1, ADD COLUMN n INT NULL, ADD COLUMN since DATE "
        "DEFAULT '2024-01-02', ADD COLUMN raw VARBINARY(4) DEFAULT x'00ff', ADD COLUMN zero INT NOT NULL",
        "INSERT INTO t (id, v, channel, amount, zero) VALUES (6001, 1, 'app', NULL, 3)",
        "UPDATE t SET channel = 'shop', zero = 2 WHERE id BETWEEN 20 AND 40",
        "DELETE FROM t WHERE id BETWEEN 2990 AND 3000",
        database=db,
    )
    _applied(cdc_settings, store, th)
    assert th.error is None and stream_state(store)["running"], th.error
    _equal(cdc_settings, sink, table)
    history = [h for h in store.read_json(SCHEMA_HISTORY) if h["table"] == table]
    assert "warning" not in history[-1]
    assert history[-1]["filled"] == {"channel": "web", "amount": {"decimal": "9.99"}, "flag": True,
                                     "since": {"date": "2024-01-02"}, "raw": {"hex": "00ff"}, "zero": 0}  # fmt: skip
    rows = {r["id"]: r for r in sink.read(table).to_pylist()}
    assert rows[5]["channel"] == "web" and rows[5]["v"] == 6 and rows[25]["channel"] == "shop"

    # dropped again (lenient keeps it): rows changed from then on read NULL there, not the old default
    mariadb.execute("ALTER TABLE t DROP COLUMN amount", "UPDATE t SET v = -v WHERE id <= 10", database=db)
    _applied(cdc_settings, store, th)
    assert th.error is None, th.error
    rows = {r["id"]: r for r in sink.read(table).to_pylist()}
    assert rows[5]["amount"] is None and str(rows[50]["amount"]) == "9.99" and rows[5]["v"] == -6


def test_add_column_with_an_expression_default_warns_that_existing_rows_read_null(
    streaming: Any, cdc_settings: Any
) -> None:
    """CURRENT_TIMESTAMP was evaluated when the ALTER ran, which the stream cannot know: the schema
    history and the log say so and name the re-snapshot; literal defaults of the same ALTER are filled."""
    mariadb, db, table, store, sink, th = streaming
    mariadb.execute("ALTER TABLE t ADD COLUMN made TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, "
                    "ADD COLUMN channel VARCHAR(8) NOT NULL DEFAULT 'web'",
                    "INSERT INTO t (id, v, channel) VALUES (6001, 1, 'app')", database=db)  # fmt: skip
    _applied(cdc_settings, store, th)
    assert th.error is None and stream_state(store)["running"], th.error
    history = [h for h in store.read_json(SCHEMA_HISTORY) if h["table"] == table]
    warning = history[-1]["warning"]
    assert "made" in warning and "current_timestamp" in warning and "resnapshot_tables" in warning
    assert "channel" not in warning and history[-1]["filled"] == {"channel": "web"}
    rows = {r["id"]: r for r in sink.read(table).to_pylist()}
    assert rows[6001]["made"] is not None and rows[1]["made"] is None and rows[1]["channel"] == "web"


@pytest.mark.parametrize("stream_policy", ["evolve"])
def test_truncate_closes_every_removed_row_in_the_changelog(streaming: Any, cdc_settings: Any) -> None:
    """A TRUNCATE logs no row event: under evolve the changelog gets a delete of every row it removed
    (the ones changed or added earlier in the same batch too), so the SCD2 view keeps none of them
    current; twice in one batch, each removes what the table held then."""
    from airflow_provider_mysqlcdc.sinks.delta_changelog import read_scd2

    mariadb, db, table, store, sink, th = streaming
    mariadb.execute(
        "UPDATE t SET v = -v WHERE id <= 10", "INSERT INTO t (id, v, note) VALUES (5001, 1, 'x')",
        "DELETE FROM t WHERE id = 2", "TRUNCATE TABLE t",
        "INSERT INTO t (id, v, note) VALUES (7001, 1, 'between'), (7002, 2, 'between')", "TRUNCATE TABLE t",
        "INSERT INTO t (id, v, note) VALUES (9001, 1, 'after')", database=db,
    )  # fmt: skip
    _applied(cdc_settings, store, th)
    assert th.error is None, th.error
    _equal(cdc_settings, sink, table)
    log = order_key(read_changelog(sink, table))
    deletes = [r["before"]["id"] for r in log.to_pylist() if r["_op"] == "d"]
    assert sorted(deletes) == sorted([2, *(i for i in range(1, 3001) if i != 2), 5001, 7001, 7002])
    current = read_scd2(sink, table, ["id"]).filter(pc.field("is_current"))
    assert current.column("id").to_pylist() == [9001]
    closed = read_scd2(sink, table, ["id"]).filter(pc.field("id") == 5)
    assert closed.column("v").to_pylist() == [-5] and closed.column("valid_to").null_count == 0  # at the TRUNCATE


@pytest.mark.parametrize("stream_policy", ["fail"])
def test_truncate_stops_the_stream_and_a_resnapshot_recovers(
    streaming: Any, cdc_settings: Any, spark: Any
) -> None:
    from airflow_provider_mysqlcdc.core.config import PipelineConfig
    from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
    from airflow_provider_mysqlcdc.stream.control import checkpoint_offset

    mariadb, db, table, store, sink, th = streaming
    mariadb.execute("UPDATE t SET v = -v WHERE id <= 100", "DELETE FROM t WHERE id > 2900", database=db)
    mariadb.execute("TRUNCATE TABLE t", "INSERT INTO t VALUES (1, 1, 'after')", database=db)
    th.join(timeout=180)
    assert not th.is_alive()
    assert isinstance(th.error, StreamSchemaError), th.error
    msg = str(th.error)
    assert "TRUNCATE" in msg and f"resnapshot_tables=['{table}']" in msg
    run = store.read_json("stream/run.json")
    assert run["state"] == "failed" and "TRUNCATE" in run["error"]
    # Stopped before the TRUNCATE: the sink still has the rows, nothing after the TRUNCATE applied,
    # and the checkpoint is not past it (the batch holding it was never committed).
    rows = sink.read(table).to_pylist()
    assert len(rows) >= 2900 and not any(r["note"] == "after" for r in rows)
    ddl_at = store.read_json("stream/schema-change.json")["changes"][0]["offset"]
    from airflow_provider_mysqlcdc.core.offset import BinlogOffset

    ckpt = checkpoint_offset(store)  # None: no batch committed since the stream started
    assert ckpt is None or ckpt <= BinlogOffset.from_dict(ddl_at)

    # The fix the message names: re-snapshot the table; the stream then resumes past the TRUNCATE.
    config = PipelineConfig.from_params(
        pipeline_id="ddl", sink_root=sink.root, state_root=store.state_root, tables=[table],
        resnapshot_tables=[table], chunk_size=500, chunks_per_task=4,
    )
    with cdc_settings.connect() as conn:
        outcome = plan_run(conn, store, config, "p2", sink.exists)
    assert outcome.resnapshot_tables == [table]
    for g in outcome.groups:
        run_snapshot_group(spark, cdc_settings, store, "p2", g["group_id"], sink)
    finalize_run(store, sink, "p2")
    mariadb.execute("INSERT INTO t VALUES (2, 2, 'resumed', )".replace(", )", ")"), database=db)
    th2 = StreamThread(spark, cdc_settings, store, sink, run_id="schema-test-2")
    th2.start()
    try:
        _applied(cdc_settings, store, th2)
        assert th2.error is None, th2.error
        _equal(cdc_settings, sink, table)
    finally:
        th2.stop_event.set()
        th2.join(timeout=120)
