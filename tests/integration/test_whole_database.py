"""A whole database captured by pattern, with tables created and dropped while the stream runs.

200 tables (BIGINT, composite (VARCHAR, INT) and case-insensitive VARCHAR keys) are planned with
``tables=["<db>.*"]``, snapshotted and streamed (``run_stream`` in a thread, policy ``lenient``)
while a writer changes all of them. Meanwhile 5 tables are created — plain, ``CREATE ... LIKE``,
``CREATE ... SELECT``, a composite key, one the checks refuse (no key) — and 2 dropped, one of
them created again with another shape. Then every captured table equals its source, the created
ones captured from their CREATE with no snapshot (the writer also runs during the snapshot, whose
one-chunk tables are read by one Spark job per group); the dropped one keeps its rows as they were at
the DROP (lenient), and the keyless one is reported as refused. The same scenario runs through the
example DAG in test_airflow_dag.py::test_form_pattern_captures_a_database_while_tables_come_and_go.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from airflow_provider_mysqlcdc.stream.schema_follow import SCHEMA_HISTORY
from tests.support.stream_thread import StreamThread
from tests.support.verify import assert_sink_equals_source

TABLES = 200
ROWS = 20


def _kind(name: str) -> str:
    return ("int", "comp", "ci")[int(name[1:4]) % 3] if name[0] == "t" else "int"


def _create(name: str, kind: str) -> list[str]:
    if kind == "comp":
        return [f"CREATE TABLE {name} (region VARCHAR(8) NOT NULL, n INT NOT NULL, v INT, PRIMARY KEY (region, n))",
                f"INSERT INTO {name} SELECT ELT(1 + seq % 3, 'eu', 'us', 'apac'), seq, seq FROM seq_1_to_{ROWS}"]
    if kind == "ci":
        return [f"CREATE TABLE {name} (k VARCHAR(24) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)",
                f"INSERT INTO {name} SELECT CONCAT(IF(seq % 2, 'key', 'KEY'), LPAD(seq, 4, '0')), seq "
                f"FROM seq_1_to_{ROWS}"]  # fmt: skip
    return [f"CREATE TABLE {name} (id BIGINT NOT NULL PRIMARY KEY, v INT, note VARCHAR(20))",
            f"INSERT INTO {name} SELECT seq, seq, CONCAT('n', seq) FROM seq_1_to_{ROWS}"]  # fmt: skip


def _statement(rnd: random.Random, name: str, kind: str) -> str:
    k, r = rnd.randint(1, ROWS + 10), rnd.random()
    if kind == "comp":
        key = f"region = '{('eu', 'us', 'apac')[k % 3]}' AND n = {k}"
        if r < 0.2:
            return f"INSERT IGNORE INTO {name} VALUES ('{('eu', 'us', 'apac')[k % 3]}', {k}, {k})"
    elif kind == "ci":
        key = f"k = '{rnd.choice(('key', 'KEY', 'Key'))}{k:04d}'"  # case-only differences: the same row
        if r < 0.2:
            return f"INSERT IGNORE INTO {name} VALUES ('{rnd.choice(('key', 'KEY'))}{k:04d}', {k})"
    else:
        key = f"id = {k}"
        if r < 0.2:
            return f"INSERT IGNORE INTO {name} (id, v) VALUES ({k}, {k})"
    if r < 0.3:
        return f"DELETE FROM {name} WHERE {key}"
    return f"UPDATE {name} SET v = v + 1 WHERE {key}"


class Writer(threading.Thread):
    def __init__(self, mariadb: Any, db: str, names: list[str]):
        super().__init__(daemon=True)
        self.mariadb, self.db, self.live = mariadb, db, {n: _kind(n) for n in names}
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.rnd = random.Random(7)
        self.statements = 0

    def run(self) -> None:
        conn = self.mariadb.root_connection(self.db)
        with conn.cursor() as cur:
            while not self.stop_event.is_set():
                with self.lock:
                    name = self.rnd.choice(sorted(self.live))
                    cur.execute(_statement(self.rnd, name, self.live[name]))
                    self.statements += 1
                time.sleep(0.002)
        conn.close()

    def ddl(self, *statements: str, add: dict[str, str] | None = None, remove: tuple[str, ...] = ()) -> None:
        with self.lock:
            self.mariadb.execute(*statements, database=self.db)
            for n in remove:
                self.live.pop(n, None)
            self.live.update(add or {})


def tables_come_and_go(writer: Writer) -> None:
    """The DDL of the scenario, run while the stream runs: 5 tables created (one keyless, refused),
    one excluded by name, t010 dropped (its rows kept in skip_t010_copy), t020 dropped and created
    again with another shape (captured from the new CREATE: the lake table starts over)."""
    writer.ddl(*_create("n_plain", "int"), add={"n_plain": "int"})
    writer.ddl("CREATE TABLE n_like LIKE t001", "INSERT INTO n_like SELECT * FROM t001", add={"n_like": "comp"})
    writer.ddl("CREATE TABLE n_select (id BIGINT NOT NULL PRIMARY KEY, v INT, note VARCHAR(20)) "
               "SELECT id, v, note FROM t003", add={"n_select": "int"})  # fmt: skip
    writer.ddl(*_create("n_comp", "comp"), add={"n_comp": "comp"})
    writer.ddl("CREATE TABLE n_nokey (a INT, b INT)", "INSERT INTO n_nokey VALUES (1, 1)")
    writer.ddl("CREATE TABLE skip_me (id INT PRIMARY KEY)")  # excluded by the pipeline
    writer.ddl("CREATE TABLE skip_t010_copy LIKE t010", "INSERT INTO skip_t010_copy SELECT * FROM t010",
               "DROP TABLE t010", remove=("t010",))  # fmt: skip
    writer.ddl("DROP TABLE t020", remove=("t020",))
    time.sleep(1)
    writer.ddl("CREATE TABLE t020 (id BIGINT NOT NULL PRIMARY KEY, v INT, extra VARCHAR(10))",
               "INSERT INTO t020 SELECT seq, -seq, 'again' FROM seq_1_to_7", add={"t020": "int"})  # fmt: skip


def assert_captured_as_the_source(settings: Any, store: StateStore, sink: DeltaSink, db: str, names: list[str]) -> None:
    """After :func:`tables_come_and_go` and the stream's catch-up: every captured table equals its
    source, the dropped one keeps its rows as at the DROP (lenient), the keyless one is refused."""
    manifest = store.read_manifest()
    expected = sorted({*names, "n_plain", "n_like", "n_select", "n_comp"} - {"t010"})
    assert sorted(t for t, e in manifest.tables.items() if e.ended_at is None) == [f"{db}.{n}" for n in expected]
    assert manifest.ended_tables() == [f"{db}.t010"] and f"{db}.n_nokey" in manifest.refused
    for n in expected:
        assert_sink_equals_source(settings, sink, f"{db}.{n}")
    assert_sink_equals_source(settings, sink, f"{db}.t010", f"{db}.skip_t010_copy")
    assert "extra" in sink.read(f"{db}.t020").schema.names


def test_pattern_capture_with_tables_created_and_dropped_while_streaming(
    mariadb: Any, db: str, cdc_settings: Any, spark: Any, tmp_path: Any
) -> None:
    names = [f"t{i:03d}" for i in range(TABLES)]
    mariadb.execute(*[s for n in names for s in _create(n, _kind(n))], database=db)
    mariadb.execute("CREATE VIEW v_all AS SELECT id FROM t000", database=db)  # a view: skipped, not captured
    store, sink = StateStore(str(tmp_path / "state"), "wholedb"), DeltaSink(str(tmp_path / "lake"), owner="wholedb")
    writer = Writer(mariadb, db, names)
    writer.start()  # writing while the one-chunk tables are read together (one Spark job per group)
    config = PipelineConfig.from_params(pipeline_id="wholedb", sink_root=sink.root, state_root=store.state_root,
                                        tables=[f"{db}.*"], exclude_tables=[f"{db}.skip_*"], chunk_size=100,
                                        chunks_per_task=64)  # fmt: skip
    with cdc_settings.connect() as conn:
        outcome = plan_run(conn, store, config, "p1", sink.exists)
    assert len(outcome.snapshot_tables) == TABLES and any("v_all" in n for n in outcome.notes)
    for g in outcome.groups:
        run_snapshot_group(spark, cdc_settings, store, "p1", g["group_id"], sink)
    finalize_run(store, sink, "p1")
    assert store.read_manifest().selection.tables == (f"{db}.*",)

    opts = StreamOptions(trigger_seconds=0.5, schema_change_policy="lenient")
    th = StreamThread(spark, cdc_settings, store, sink, run_id="wholedb-1", options=opts).start_running()
    try:
        time.sleep(2)
        tables_come_and_go(writer)
        time.sleep(3)
        writer.stop_event.set()
        writer.join(timeout=30)
        assert writer.statements > 300
        th.wait_applied(cdc_settings)
        assert th.error is None, th.error

        assert_captured_as_the_source(cdc_settings, store, sink, db, names)
        assert f"{db}.skip_me" not in store.read_manifest().tables
        assert "note" not in sink.read(f"{db}.t020").schema.names
        history = {h["table"]: h for h in store.read_json(SCHEMA_HISTORY)}
        assert history[f"{db}.n_plain"]["done"] == "captured from its CREATE"
        assert "not captured" in history[f"{db}.n_nokey"]["done"]
        assert not store.exists("plans/p2")  # no snapshot of the new tables: only the binlog
    finally:
        writer.stop_event.set()
        th.stop_event.set()
        th.join(timeout=120)
