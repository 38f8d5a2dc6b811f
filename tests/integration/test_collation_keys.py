"""String chunk keys in the collations only the server can order, snapshotted and streamed exactly.

The UCA collations — a server's default on MySQL 8+ (``utf8mb4_0900_ai_ci``) and MariaDB 11
(``utf8mb4_uca1400_ai_ci``), ``*_unicode_520_ci`` (characters above U+FFFF weigh apart), language
tailorings with contractions (``ch`` and ``ll`` in Spanish2), several weight levels under NO PAD —
are placed into chunks by the server's weight strings of whole values (``core/keys``, method
``server``). Each table is keyed by a VARCHAR in one of them, holding values that differ by case,
accents, trailing spaces, tabs, emoji and contractions; a writer inserts, updates, deletes and moves
keys to such variants of themselves while the tables are snapshotted in several groups, and the
stream starts from the minimum high watermark: once it has caught up, every Delta table equals its
source row for row. On MariaDB 11.8 and MySQL 9.7 the random writer's three tricky-key tables
(``tests/support/random_writer.py``: key moves across chunks and groups, a composite key, case-only
key changes) ride along in the same snapshot and stream. A collation whose order cannot be placed
exactly is skipped with its reason (``tests/integration/test_table_selection.py``).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.mysql.collation import fetch_collation
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.job import StreamOptions, start_stream, stop_gracefully, wait_until_caught_up
from tests.integration.test_stream_e2e import assert_sink_equals_source
from tests.support.mariadb import MariaDBServer
from tests.support.random_writer import RandomWriter, make_tables

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

#: Each server's collations of each kind the server orders: its default first (MariaDB 10.11's own
#: default is utf8mb4_general_ci, a per-character table: MariaDB 11's default stands in).
COLLATIONS = {
    "mariadb1011": [
        "utf8mb4_uca1400_ai_ci",  # one level, PAD SPACE
        "utf8mb4_unicode_520_ci",  # characters above U+FFFF weigh apart
        "utf8mb4_uca1400_spanish2_ai_ci",  # contractions: ch, ll
        "utf8mb4_uca1400_nopad_as_cs",  # three levels, NO PAD
    ],
    "mariadb118": ["utf8mb4_uca1400_ai_ci", "utf8mb4_uca1400_spanish2_ai_ci", "utf8mb4_uca1400_nopad_as_cs"],
    "mysql97": ["utf8mb4_0900_ai_ci", "utf8mb4_0900_as_cs", "utf8mb4_es_trad_0900_ai_ci"],  # all NO PAD
}
ROWS = 2_000
TRICKY_ROWS = 3_000
CHUNK = 100
LETTERS = "aAáÁbBcCçhHlLnNñoOöß" + "\U0001f600\U0001f9ea"


def _value(rng: random.Random) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 6)))


def _variant(rng: random.Random, s: str) -> str:
    """A value equal to ``s``, or right next to it, under some of the collations."""
    return rng.choice([s.upper(), s.lower(), s.swapcase(), s + " ", s + "  ", s + "\t", s.rstrip(),
                       s.replace("c", "ch"), s.replace("ch", "c"), s + "\U0001f600", s.replace("a", "á"),
                       s[:-1] or "x", "ll" + s])  # fmt: skip


def _tables(server: MariaDBServer, db: str, collations: list[str]) -> list[str]:
    rng = random.Random(34)
    names = []
    for i, coll in enumerate(collations):
        server.execute(f"CREATE TABLE `{db}`.k{i} (k VARCHAR(40) CHARACTER SET utf8mb4 COLLATE {coll} NOT NULL "
                       "PRIMARY KEY, v INT NOT NULL)")  # fmt: skip
        with server.root_connection(db) as conn, conn.cursor() as cur:
            values = [_value(rng) for _ in range(ROWS)]
            values += [_variant(rng, v) for v in values[: ROWS // 3]]
            cur.executemany(f"INSERT IGNORE INTO k{i} VALUES (%s, %s)", [(v, n) for n, v in enumerate(values)])
        names.append(f"{db}.k{i}")
    return names


class _VariantWriter(threading.Thread):
    """Inserts, updates, deletes and key moves to variants of a row's own key, on every table."""

    def __init__(self, server: MariaDBServer, db: str, tables: int):
        super().__init__(daemon=True)
        self.server, self.db, self.tables = server, db, tables
        self.stop_event = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        rng = random.Random(7)
        conn = self.server.root_connection(self.db)
        cur = conn.cursor()
        while not self.stop_event.is_set():
            t = f"k{rng.randrange(self.tables)}"
            cur.execute(f"SELECT k FROM {t} ORDER BY RAND() LIMIT 1")
            row = cur.fetchone()
            k = row[0] if row else _value(rng)
            r = rng.random()
            if r < 0.3:
                cur.execute(f"INSERT IGNORE INTO {t} VALUES (%s, %s)", (_variant(rng, k), rng.randrange(10**6)))
            elif r < 0.55:
                cur.execute(f"UPDATE {t} SET v = v + 1 WHERE k = %s", (k,))
            elif r < 0.7:
                cur.execute(f"DELETE FROM {t} WHERE k = %s", (k,))
            else:  # a key move, to a value equal or adjacent under the collation
                cur.execute(f"UPDATE IGNORE {t} SET k = %s WHERE k = %s", (_variant(rng, k), k))
            self.transactions += 1
            self.stop_event.wait(0.004)
        conn.close()


def test_keys_in_server_ordered_collations_snapshot_and_stream_exactly(server, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    flavour = _flavour(server)
    collations = COLLATIONS[flavour]
    db = "coll_" + uuid.uuid4().hex[:8]
    server.execute(f"CREATE DATABASE {db}")
    cdc_settings = server.cdc_settings()
    writers: list[Any] = []
    try:
        tables = _tables(server, db, collations)
        with cdc_settings.connect() as conn:
            methods = {c: fetch_collation(conn, c).method for c in collations}
        assert set(methods.values()) == {"server"}, methods  # none of them by a per-character table
        store = StateStore(str(tmp_path / "state"), "coll")
        sink = DeltaSink(str(tmp_path / "lake"))
        writer = _VariantWriter(server, db, len(tables))
        writers.append(writer)
        if flavour != "mariadb1011":  # the tricky-key tables ride along (MariaDB 10.11: test_stream_e2e)
            tables += make_tables(server, db, rows=TRICKY_ROWS)
            writers.append(RandomWriter(server, db, rate=100, rows=TRICKY_ROWS))
        for w in writers:
            w.start()
        try:
            plan = _snapshot(spark, cdc_settings, store, sink, tables)
            query = start_stream(spark, cdc_settings, store, sink, StreamOptions(trigger_seconds=0.5))
            try:
                time.sleep(4)  # the writers keep going while the stream runs
                for w in writers:
                    w.stop_event.set()
                    w.join()
                with cdc_settings.connect() as conn:
                    target = current_offset(conn)
                wait_until_caught_up(query, target)
            finally:
                stop_gracefully(query)
        finally:
            for w in writers:
                w.stop_event.set()
        assert all(w.transactions > 200 for w in writers), [w.transactions for w in writers]
        assert all(isinstance(plan.collations[c], Collation) and plan.collations[c].method == "server"
                   for c in collations)  # fmt: skip
        assert_sink_equals_source(cdc_settings, plan, sink, tables)
    finally:
        server.execute(f"DROP DATABASE IF EXISTS {db}")


def _flavour(server: MariaDBServer) -> str:
    version = str(server.query("SELECT VERSION()")[0][0])
    if "MariaDB" not in version:
        return "mysql97"
    return "mariadb118" if version.startswith("11.") else "mariadb1011"


def _snapshot(spark: Any, cdc_settings: Any, store: StateStore, sink: DeltaSink, tables: list[str]) -> Any:
    """Every table in ~20 chunks, in several groups, each group's window read under the writer."""
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, tables, CHUNK, 8)
    assert len(plan.groups) >= 3, len(plan.groups)
    store.write_plan("p1", plan.to_dict())
    for g in plan.groups:
        run_snapshot_group(spark, cdc_settings, store, "p1", g.group_id, sink)
    store.write_manifest(build_manifest(plan, store.read_all_results("p1")))
    return plan
