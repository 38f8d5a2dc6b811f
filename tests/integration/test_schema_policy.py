"""The schema-change policy while a writer runs: every DDL of issue 13 item 4 under each policy.

Eight tables are snapshotted and streamed (``run_stream`` in a thread, Spark local[2]) while a
writer changes all of them. One DDL per table, each run between the writer's statements:
ADD COLUMN, DROP COLUMN, RENAME COLUMN, a compatible MODIFY (a widening and a longer VARCHAR),
TRUNCATE, DROP TABLE, RENAME TABLE and a gh-ost migration (a shadow table created, altered and
filled, then renamed in under the captured name). Then:

* ``evolve``: every table still captured equals its source; a truncated one holds only what was
  written after; dropped and renamed-away ones are empty and no longer captured;
* ``lenient``: the same where nothing is lost (ADD, MODIFY); a dropped column is kept (NULL in rows
  written after); a renamed column is added and the old kept; a truncated table keeps its rows;
  dropped and renamed-away tables keep exactly what they held at the DDL;
* ``fail``: each DDL stops the stream with a message naming the table, the DDL and the fix; the
  fix (a restart under ``evolve``) resumes with no change lost.

Under both ``evolve`` and ``lenient`` the gh-ost table continues from its shadow (captured from its
CREATE) with no re-snapshot, and the next DAG run (plan over ``t_*``) captures the table renamed to
a new selected name.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.options import StreamOptions
from airflow_provider_mysqlcdc.stream.schema_follow import SCHEMA_HISTORY, StreamSchemaError
from tests.support.stream_thread import StreamThread, snapshot_tables
from tests.support.verify import assert_sink_equals_source

ROWS = 2000
UNTOUCHED = 10  # the last rows of each table: no writer statement touches them
NAMES = ["t_add", "t_dropcol", "t_renamecol", "t_modify", "t_truncate", "t_drop", "t_rename", "t_swap"]


class Writer(threading.Thread):
    """Single-row inserts, updates and deletes on every live table; DDL runs under ``lock``."""

    def __init__(self, mariadb: Any, db: str, tables: list[str]):
        super().__init__(daemon=True)
        self.mariadb, self.db = mariadb, db
        self.live = list(tables)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.rnd = random.Random(13)
        self.statements = 0

    def run(self) -> None:
        conn = self.mariadb.root_connection(self.db)
        with conn.cursor() as cur:
            while not self.stop_event.is_set():
                with self.lock:
                    if not self.live:
                        break
                    t = self.rnd.choice(self.live)
                    k = self.rnd.randint(1, ROWS - UNTOUCHED)
                    r = self.rnd.random()
                    if r < 0.2:
                        sql = f"INSERT IGNORE INTO `{t}` (id, v) VALUES ({ROWS + self.rnd.randint(1, 3000)}, {k})"
                    elif r < 0.3:
                        sql = f"DELETE FROM `{t}` WHERE id = {k}"
                    else:
                        sql = f"UPDATE `{t}` SET v = v + 1 WHERE id = {k}"
                    cur.execute(sql)
                    self.statements += 1
                time.sleep(0.004)
        conn.close()

    def ddl(self, table: str, *statements: str, keep_writing: bool = True) -> None:
        """Run ``statements`` between two writer statements; the writer leaves ``table`` after if asked."""
        with self.lock:
            self.mariadb.execute(*statements, database=self.db)
            if not keep_writing and table in self.live:
                self.live.remove(table)


def _make_tables(mariadb: Any, db: str) -> list[str]:
    stmts = []
    for t in NAMES:
        stmts += [
            f"CREATE TABLE `{db}`.{t} (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, note VARCHAR(20), extra INT)",
            f"INSERT INTO `{db}`.{t} SELECT seq, seq, CONCAT('n', seq), seq FROM seq_1_to_{ROWS}",
        ]
    mariadb.execute(*stmts, database=db)
    return [f"{db}.{t}" for t in NAMES]


def _copy(t: str) -> list[str]:
    """Statements keeping ``t``'s rows as they are now in ``_before_t`` (what a kept lake table must hold)."""
    return [f"CREATE TABLE `_before_{t}` LIKE `{t}`", f"INSERT INTO `_before_{t}` SELECT * FROM `{t}`"]


def _schema(settings: Any, table: str) -> Any:
    with settings.connect() as conn:
        return read_table_schema(conn, TableId.parse(table))


def _rows(sink: DeltaSink, table: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in sink.read(table).to_pylist()}


def _run_ddls(w: Writer, db: str) -> None:
    q = f"`{db}`"
    w.ddl("t_add", f"ALTER TABLE {q}.t_add ADD COLUMN c2 VARCHAR(10) NULL",
          f"UPDATE {q}.t_add SET c2 = CONCAT('c', id) WHERE id % 7 = 0")  # fmt: skip
    w.ddl("t_dropcol", f"ALTER TABLE {q}.t_dropcol DROP COLUMN note")
    w.ddl("t_renamecol", f"ALTER TABLE {q}.t_renamecol RENAME COLUMN note TO label",
          f"UPDATE {q}.t_renamecol SET label = CONCAT('L', id) WHERE id % 5 = 0")  # fmt: skip
    w.ddl("t_modify", f"ALTER TABLE {q}.t_modify MODIFY extra BIGINT, MODIFY note VARCHAR(50)",
          f"UPDATE {q}.t_modify SET extra = 5000000000 + id, note = REPEAT('x', 40) WHERE id % 9 = 0")  # fmt: skip
    w.ddl("t_truncate", *_copy("t_truncate"), f"TRUNCATE TABLE {q}.t_truncate",
          f"INSERT INTO {q}.t_truncate (id, v, note) VALUES (9001, 1, 'after'), (9002, 2, 'after')",
          keep_writing=False)  # fmt: skip
    w.ddl("t_drop", *_copy("t_drop"), f"DROP TABLE {q}.t_drop", keep_writing=False)
    w.ddl("t_rename", *_copy("t_rename"), f"RENAME TABLE {q}.t_rename TO {q}.t_renamed",
          keep_writing=False)  # fmt: skip
    # gh-ost: shadow table, altered, filled; the cut-over renames it in under the captured name
    w.ddl("t_swap", "CREATE TABLE _t_swap_gho LIKE t_swap",
          "ALTER TABLE _t_swap_gho ADD COLUMN added INT NOT NULL DEFAULT 7",
          "INSERT INTO _t_swap_gho (id, v, note, extra) SELECT id, v, note, extra FROM t_swap", *_copy("t_swap"),
          "RENAME TABLE t_swap TO _t_swap_del, _t_swap_gho TO t_swap")  # fmt: skip


@pytest.fixture
def pipeline(mariadb: Any, db: str, cdc_settings: Any, spark: Any, tmp_path: Any):  # type: ignore[no-untyped-def]
    tables = _make_tables(mariadb, db)
    store, sink = StateStore(str(tmp_path / "state"), "policy"), DeltaSink(str(tmp_path / "lake"), owner="policy")
    snapshot_tables(spark, cdc_settings, store, sink, tables, 500, 8)
    writer = Writer(mariadb, db, list(NAMES))
    threads: list[StreamThread] = []
    yield tables, store, sink, writer, threads
    writer.stop_event.set()
    for th in threads:
        th.stop_event.set()
        th.join(timeout=120)


def _start(spark: Any, settings: Any, store: StateStore, sink: DeltaSink, policy: str, threads: list[StreamThread],
           n: int) -> StreamThread:  # fmt: skip
    opts = StreamOptions(trigger_seconds=0.5, schema_change_policy=policy)
    th = StreamThread(spark, settings, store, sink, run_id=f"policy-{n}", options=opts).start_running()
    threads.append(th)
    assert th.error is None, th.error
    return th


@pytest.mark.parametrize("policy", ["evolve", "lenient"])
def test_every_ddl_while_writing(pipeline: Any, mariadb: Any, db: str, cdc_settings: Any, spark: Any,
                                 policy: str) -> None:  # fmt: skip
    _, store, sink, writer, threads = pipeline
    th = _start(spark, cdc_settings, store, sink, policy, threads, 1)
    writer.start()
    time.sleep(2)
    _run_ddls(writer, db)
    time.sleep(2)
    writer.stop_event.set()
    writer.join(timeout=30)
    th.wait_applied(cdc_settings)
    assert th.error is None, th.error
    assert writer.statements > 200
    t = {n: f"{db}.{n}" for n in NAMES}
    for n in ("t_add", "t_modify"):  # nothing to lose: equal under both policies
        assert_sink_equals_source(cdc_settings, sink, t[n])
    assert str(sink.read(t["t_modify"]).schema.field("extra").type) == "int64"
    manifest = store.read_manifest()
    ended = manifest.ended_tables()
    assert ended == sorted([t["t_drop"], t["t_rename"], f"{db}._t_swap_gho"])
    # the gh-ost cut-over: t_swap continues from its shadow's rows, captured from the shadow's CREATE
    assert_sink_equals_source(cdc_settings, sink, t["t_swap"])
    assert "added" in sink.read(t["t_swap"]).schema.names
    assert manifest.tables[f"{db}._t_swap_gho"].shadow_of == t["t_swap"]
    assert [s for _, s in manifest.tables[t["t_swap"]].replaced_from] == [f"{db}._t_swap_gho"]
    if policy == "evolve":
        for n in ("t_dropcol", "t_renamecol", "t_truncate"):
            assert_sink_equals_source(cdc_settings, sink, t[n])
        assert "note" not in sink.read(t["t_dropcol"]).schema.names
        names = sink.read(t["t_renamecol"]).schema.names
        assert "label" in names and "note" not in names
        assert sorted(_rows(sink, t["t_truncate"])) == [9001, 9002]
        assert sink.read(t["t_drop"]).num_rows == 0 and sink.read(t["t_rename"]).num_rows == 0
        assert manifest.tables[t["t_renamecol"]].renamed_columns == {"note": "label"}
    else:
        assert_sink_equals_source(cdc_settings, sink, t["t_dropcol"])  # on the source's columns; the lake keeps note
        dropcol = _rows(sink, t["t_dropcol"])
        assert all(dropcol[i]["note"] == f"n{i}" for i in range(ROWS - UNTOUCHED + 1, ROWS + 1))
        with cdc_settings.connect() as conn, conn.cursor() as cur:
            cur.execute(f"SELECT id, label FROM `{db}`.t_renamecol")
            source_labels = dict(cur.fetchall())
        renamed = _rows(sink, t["t_renamecol"])
        # rows written since the rename carry label (note NULL), the others still their note
        assert {i: r["label"] if r["label"] is not None else r["note"] for i, r in renamed.items()} == source_labels
        assert any(r["label"] is None and r["note"] for r in renamed.values())
        assert any(r["label"] and r["note"] is None for r in renamed.values())
        assert manifest.tables[t["t_renamecol"]].retired_columns == ["note"]
        # TRUNCATE ignored: the rows before it, plus what was written after
        truncated = _rows(sink, t["t_truncate"])
        before = _rows_of(cdc_settings, f"{db}._before_t_truncate")
        assert set(truncated) == set(before) | {9001, 9002}
        assert all(truncated[i]["v"] == before[i]["v"] for i in before)
        for n in ("t_drop", "t_rename"):  # kept as they were at the DDL
            assert_sink_equals_source(cdc_settings, sink, t[n], f"{db}._before_{n}")
    history = store.read_json(SCHEMA_HISTORY)
    assert {h["table"] for h in history} >= {t[n] for n in NAMES}
    assert all(h["policy"] == policy for h in history)

    # The next DAG run: the renamed-in table is new; the cut-over one stays captured as it is.
    config = PipelineConfig.from_params(pipeline_id="policy", sink_root=sink.root, state_root=store.state_root,
                                        tables=[f"{db}.t_*"], chunk_size=500, chunks_per_task=8)  # fmt: skip
    with cdc_settings.connect() as conn:
        outcome = plan_run(conn, store, config, "p2", sink.exists)
    assert outcome.snapshot_tables == [f"{db}.t_renamed"] and outcome.resnapshot_tables == []
    for g in outcome.groups:
        run_snapshot_group(spark, cdc_settings, store, "p2", g["group_id"], sink)
    finalize_run(store, sink, "p2")
    mariadb.execute(f"UPDATE `{db}`.t_swap SET added = 1 WHERE id <= 20",
                    f"UPDATE `{db}`.t_renamed SET v = -v WHERE id <= 20")  # fmt: skip
    th.wait_applied(cdc_settings)
    assert th.error is None, th.error
    assert_sink_equals_source(cdc_settings, sink, t["t_swap"])
    assert_sink_equals_source(cdc_settings, sink, f"{db}.t_renamed")
    assert store.read_manifest().tables[t["t_swap"]].ended_at is None
    assert not store.read_manifest().tables[f"{db}.t_renamed"].ended_at


def _rows_of(settings: Any, table: str) -> dict[int, dict[str, Any]]:
    with settings.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, v FROM {TableId.parse(table).quoted}")
        return {i: {"v": v} for i, v in cur.fetchall()}


def test_fail_stops_before_each_ddl_and_the_fix_resumes(pipeline: Any, db: str, cdc_settings: Any,
                                                        spark: Any) -> None:  # fmt: skip
    _, store, sink, writer, threads = pipeline
    q = f"`{db}`"
    steps = [
        ("t_add", "ALTER", [f"ALTER TABLE {q}.t_add ADD COLUMN c2 INT"]),
        ("t_dropcol", "ALTER", [f"ALTER TABLE {q}.t_dropcol DROP COLUMN note"]),
        ("t_renamecol", "ALTER", [f"ALTER TABLE {q}.t_renamecol RENAME COLUMN note TO label"]),
        ("t_modify", "ALTER", [f"ALTER TABLE {q}.t_modify MODIFY extra BIGINT"]),
        ("t_truncate", "TRUNCATE", [f"TRUNCATE TABLE {q}.t_truncate"]),
        ("t_drop", "DROP", [f"DROP TABLE {q}.t_drop"]),
        ("t_rename", "RENAME", [f"RENAME TABLE {q}.t_rename TO {q}.t_renamed"]),
    ]
    writer.start()
    n = 0
    for name, kind, ddl in steps:
        n += 1
        th = _start(spark, cdc_settings, store, sink, "fail", threads, n)
        time.sleep(1)
        writer.ddl(name, *ddl, keep_writing=kind in ("ALTER", "TRUNCATE"))
        th.join(timeout=180)
        assert not th.is_alive(), f"the stream did not stop at {kind} of {name}"
        assert isinstance(th.error, StreamSchemaError), th.error
        msg = str(th.error)
        assert f"{kind} of {db}.{name}" in msg and "schema_change_policy is 'fail'" in msg, msg
        assert "schema_change_policy='lenient'" in msg and f"resnapshot_tables=['{db}.{name}']" in msg, msg
        assert store.read_json("stream/run.json")["state"] == "failed"
        # the fix: restart under evolve; the stream passes the DDL and every change after it arrives
        n += 1
        fixed = _start(spark, cdc_settings, store, sink, "evolve", threads, n)
        with writer.lock:  # the writer waits while the lake is compared with the source
            fixed.wait_applied(cdc_settings)
            assert fixed.error is None, fixed.error
            if kind in ("ALTER", "TRUNCATE"):
                assert_sink_equals_source(cdc_settings, sink, f"{db}.{name}")
        fixed.stop_event.set()
        fixed.join(timeout=120)
    writer.stop_event.set()
    writer.join(timeout=30)
    th = _start(spark, cdc_settings, store, sink, "fail", threads, n + 1)
    th.wait_applied(cdc_settings)
    for name in ("t_add", "t_dropcol", "t_renamecol", "t_modify", "t_truncate", "t_swap"):
        assert_sink_equals_source(cdc_settings, sink, f"{db}.{name}")
    assert store.read_manifest().ended_tables() == sorted([f"{db}.t_drop", f"{db}.t_rename"])


def test_ddl_met_after_its_table_was_renamed(pipeline: Any, db: str, cdc_settings: Any, spark: Any) -> None:
    """A stream behind the source meets DDL of tables renamed since: their definitions are read under
    the names the binlog says they have now. A gh-ost migration runs whole (shadow created, altered,
    filled, renamed in) and a table is altered then renamed away, all before the stream starts."""
    _, store, sink, writer, threads = pipeline
    q = f"`{db}`"
    writer.start()
    time.sleep(1)
    writer.ddl("t_swap", "CREATE TABLE _t_swap_gho LIKE t_swap",
               "ALTER TABLE _t_swap_gho ADD COLUMN added INT NOT NULL DEFAULT 7",
               "INSERT INTO _t_swap_gho (id, v, note, extra) SELECT id, v, note, extra FROM t_swap",
               "UPDATE _t_swap_gho SET added = id WHERE id % 4 = 0",
               "RENAME TABLE t_swap TO _t_swap_del, _t_swap_gho TO t_swap")  # fmt: skip
    writer.ddl("t_rename", f"ALTER TABLE {q}.t_rename ADD COLUMN c2 INT",
               f"UPDATE {q}.t_rename SET c2 = id WHERE id % 3 = 0", *_copy("t_rename"),
               f"ALTER TABLE {q}.t_rename RENAME TO {q}.t_renamed", keep_writing=False)  # fmt: skip
    time.sleep(1)
    th = _start(spark, cdc_settings, store, sink, "lenient", threads, 1)
    time.sleep(3)
    writer.stop_event.set()
    writer.join(timeout=30)
    th.wait_applied(cdc_settings)
    assert th.error is None, th.error
    t_swap = f"{db}.t_swap"
    assert_sink_equals_source(cdc_settings, sink, t_swap)
    assert sorted({r["added"] for r in _rows(sink, t_swap).values()} - {7})[:2] == [4, 8]
    manifest = store.read_manifest()
    assert [s for _, s in manifest.tables[t_swap].replaced_from] == [f"{db}._t_swap_gho"]
    # renamed away under lenient: kept as it was at the rename, with the column added before it
    assert manifest.ended_tables() == sorted([f"{db}.t_rename", f"{db}._t_swap_gho"])
    assert_sink_equals_source(cdc_settings, sink, f"{db}.t_rename", f"{db}._before_t_rename")
    assert any(r["c2"] == 3 for r in _rows(sink, f"{db}.t_rename").values())
