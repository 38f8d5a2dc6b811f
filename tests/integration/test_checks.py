"""check_source against REAL misconfigured servers, users and tables, and the CLI as a user runs it.

Every failure here is produced by the real thing: a private MariaDB restarted with the wrong binlog
settings, users created with partial grants, tables without a usable chunk key. Each test asserts
the problem code and that the message names the fix, and where cheap applies that fix and checks
that the problem goes away.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymysql
import pytest

from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.checks import SourceReport, check_source
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema, read_table_schemas
from tests.support.mariadb import CDC_PASSWORD, CDC_USER, MariaDBServer, ServerSettings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _cdc(server: MariaDBServer, user: str = CDC_USER, password: str = CDC_PASSWORD) -> ConnectionSettings:
    return server.cdc_settings(user, password)


def _check(settings: ConnectionSettings, tables: list[str] | None = None, **kw: Any) -> SourceReport:
    with settings.connect() as conn:
        return check_source(conn, tables, **kw)


def _codes(report: SourceReport) -> list[str]:
    return [p.code for p in report.problems]


# ------------------------------------------------------------------ server settings
@pytest.fixture(scope="module")
def private_server() -> Iterator[MariaDBServer]:
    """One private server, restarted through each misconfiguration (a restart takes ~0.3 s)."""
    server = MariaDBServer(settings=ServerSettings(log_bin=False))
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def test_binlog_off(private_server: MariaDBServer) -> None:
    private_server.restart(ServerSettings(log_bin=False))
    assert private_server.query("SELECT @@GLOBAL.log_bin") == [(0,)]
    report = _check(_cdc(private_server))
    assert _codes(report) == ["log_bin"]
    msg = report.problems[0].message
    assert "log_bin=OFF" in msg
    # every setting CDC needs, named at once: the DBA restarts the server a single time
    for setting in (
        "log_bin=mysql-bin", "binlog_format=ROW", "binlog_row_image=FULL", "binlog_row_metadata=FULL", "server_id=1",
    ):
        assert setting in msg, setting
    assert "--log-bin=mysql-bin" in msg and "--binlog-row-metadata=FULL" in msg
    assert "restart the server once" in msg
    assert not report.ok
    assert report.offset is None
    assert msg in report.summary()
    assert report.to_dict()["problems"][0]["code"] == "log_bin"


@pytest.mark.parametrize(
    ("settings", "code", "current", "fix"),
    [
        (ServerSettings(binlog_format="STATEMENT"), "binlog_format", "STATEMENT", "binlog_format=ROW"),
        (ServerSettings(binlog_format="MIXED"), "binlog_format", "MIXED", "binlog_format=ROW"),
        (ServerSettings(binlog_row_image="MINIMAL"), "binlog_row_image", "MINIMAL", "binlog_row_image=FULL"),
        (ServerSettings(binlog_row_image="NOBLOB"), "binlog_row_image", "NOBLOB", "binlog_row_image=FULL"),
        (
            ServerSettings(binlog_row_metadata="MINIMAL"),
            "binlog_row_metadata",
            "MINIMAL",
            "binlog_row_metadata=FULL",
        ),
        (
            ServerSettings(binlog_row_metadata="NO_LOG"),
            "binlog_row_metadata",
            "NO_LOG",
            "binlog_row_metadata=FULL",
        ),
    ],
    ids=["format-statement", "format-mixed", "image-minimal", "image-noblob", "metadata-minimal", "metadata-nolog"],
)
def test_binlog_misconfiguration(
    private_server: MariaDBServer, settings: ServerSettings, code: str, current: str, fix: str
) -> None:
    private_server.restart(settings)
    # the server really runs with the bad value
    assert private_server.query(f"SELECT UPPER(@@GLOBAL.{code})") == [(current,)]
    report = _check(_cdc(private_server))
    assert _codes(report) == [code]
    msg = report.problems[0].message
    assert f"is {current}" in msg
    assert fix in msg  # my.cnf line
    assert f"SET GLOBAL {code}=" in msg.replace("'", "").replace(" = ", "=")
    assert report.offset is None


def test_fixed_settings_pass_on_the_same_server(private_server: MariaDBServer) -> None:
    private_server.restart(ServerSettings(binlog_format="STATEMENT", binlog_row_image="MINIMAL"))
    assert _codes(_check(_cdc(private_server))) == ["binlog_format", "binlog_row_image"]
    private_server.restart(ServerSettings())  # ROW, FULL, FULL
    report = _check(_cdc(private_server))
    assert report.ok, report.summary()
    assert report.offset is not None and report.offset.startswith("mysql-bin.")
    assert report.is_mariadb


# ------------------------------------------------------------------ privileges
@pytest.fixture
def partial_user(mariadb: MariaDBServer) -> Iterator[Any]:
    created: list[str] = []

    def make(grants: str) -> ConnectionSettings:
        name = "u_" + uuid.uuid4().hex[:8]
        mariadb.execute(f"CREATE USER '{name}'@'%' IDENTIFIED BY 'pw'", f"GRANT {grants} ON *.* TO '{name}'@'%'")
        created.append(name)
        return _cdc(mariadb, name, "pw")

    yield make
    for name in created:
        mariadb.execute(f"DROP USER IF EXISTS '{name}'@'%'")


def test_missing_replication_slave(mariadb: MariaDBServer, partial_user: Any) -> None:
    settings = partial_user("SELECT, REPLICATION CLIENT")
    report = _check(settings)
    assert _codes(report) == ["privilege_replication_slave"]
    msg = report.problems[0].message
    assert "lacks REPLICATION SLAVE" in msg
    assert "GRANT REPLICATION SLAVE ON *.* TO" in msg
    # apply the fix the message names
    mariadb.execute(f"GRANT REPLICATION SLAVE ON *.* TO '{settings.user}'@'%'")
    assert _check(settings).ok


def test_missing_replication_client(mariadb: MariaDBServer, partial_user: Any) -> None:
    settings = partial_user("SELECT, REPLICATION SLAVE")
    # the missing privilege really matters: this user cannot read the binlog position
    with settings.connect() as conn, conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError) as err:
        cur.execute("SHOW MASTER STATUS")
    assert err.value.args[0] == 1227
    report = _check(settings)
    assert _codes(report) == ["privilege_replication_client"]
    msg = report.problems[0].message
    # MariaDB >= 10.5 calls it BINLOG MONITOR (REPLICATION CLIENT is an alias)
    assert "lacks BINLOG MONITOR" in msg
    assert "GRANT BINLOG MONITOR ON *.* TO" in msg
    mariadb.execute(f"GRANT BINLOG MONITOR ON *.* TO '{settings.user}'@'%'")
    assert _check(settings).ok


def test_missing_both_replication_privileges(partial_user: Any) -> None:
    report = _check(partial_user("SELECT"))
    assert sorted(_codes(report)) == ["privilege_replication_client", "privilege_replication_slave"]


# ------------------------------------------------------------------ tables
@pytest.fixture
def tables(mariadb: MariaDBServer, db: str) -> str:
    mariadb.execute(
        f"CREATE TABLE `{db}`.good (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(20))",
        f"CREATE TABLE `{db}`.nopk (id INT NOT NULL, n INT NULL, v VARCHAR(20), UNIQUE KEY uk_id (id))",
        f"CREATE TABLE `{db}`.nouniq (id INT NOT NULL, v VARCHAR(20), KEY k_id (id))",
        f"CREATE TABLE `{db}`.dec_pk (d DECIMAL(20,4) NOT NULL PRIMARY KEY, v INT)",
        f"INSERT INTO `{db}`.good SELECT seq, CONCAT('v', seq) FROM seq_1_to_500",
        f"INSERT INTO `{db}`.nopk SELECT seq, IF(seq % 10 = 0, NULL, seq), 'x' FROM seq_1_to_50",
        f"INSERT INTO `{db}`.nouniq SELECT seq % 20, 'x' FROM seq_1_to_50",
        f"INSERT INTO `{db}`.dec_pk SELECT seq / 4, seq FROM seq_1_to_200",
        database=db,
    )
    return db


def test_good_table_passes(cdc_settings: ConnectionSettings, tables: str) -> None:
    report = _check(cdc_settings, [f"{tables}.good", f"`{tables}`.`dec_pk`"])
    assert report.ok, report.summary()
    assert report.tables == [f"{tables}.good", f"{tables}.dec_pk"]
    assert report.offset is not None
    assert "source OK" in report.summary()


def test_schemas_read_together_equal_those_read_one_by_one(
    mariadb: MariaDBServer, cdc_settings: ConnectionSettings, tables: str
) -> None:
    """read_table_schemas (two queries per database, what a plan over many tables uses) gives each
    table exactly what read_table_schema gives, and leaves out what the server does not show."""
    mariadb.execute(
        f"CREATE TABLE `{tables}`.composite (b VARCHAR(10) COLLATE utf8mb4_general_ci NOT NULL, "
        "a INT UNSIGNED NOT NULL, t DATETIME(3), PRIMARY KEY (a, b))",
        f"CREATE VIEW `{tables}`.good_view AS SELECT id FROM `{tables}`.good",
        database=tables,
    )
    names = ["good", "nopk", "nouniq", "dec_pk", "composite", "good_view"]
    ids = [TableId(tables, n) for n in names] + [TableId(tables, "missing"), TableId("no_such_db", "good")]
    with cdc_settings.connect() as conn:
        together = read_table_schemas(conn, ids)
        one_by_one = {TableId(tables, n): read_table_schema(conn, TableId(tables, n)) for n in names}
    assert together == one_by_one
    assert together[TableId(tables, "composite")].primary_key == ["a", "b"]
    assert together[TableId(tables, "nopk")].primary_key == []


def test_unknown_table(cdc_settings: ConnectionSettings, tables: str) -> None:
    name = f"{tables}.no_such_table"
    report = _check(cdc_settings, [f"{tables}.good", name])
    assert _codes(report) == ["unknown_table"]
    p = report.problems[0]
    assert p.table == name
    assert "does not exist" in p.message
    assert f"GRANT SELECT ON `{tables}`.`no_such_table`" in p.message
    assert report.tables == [f"{tables}.good"]


def test_table_without_primary_key_needs_a_chunk_key(cdc_settings: ConnectionSettings, tables: str) -> None:
    name = f"{tables}.nopk"
    report = _check(cdc_settings, [name])
    assert _codes(report) == ["no_primary_key"]
    p = report.problems[0]
    assert p.table == name
    assert "no primary key" in p.message
    assert "chunk_key_columns" in p.message and "add a primary key" in p.message
    assert "NOT NULL columns covered by a UNIQUE index" in p.message  # what a chunk key must be (issue 33)
    # configuring a NOT NULL chunk key covered by a UNIQUE index fixes it
    fixed = _check(cdc_settings, [name], chunk_key_columns={name: ["id"]})
    assert fixed.ok, fixed.summary()
    assert fixed.tables == [name]


def test_chunk_key_without_unique_index_is_refused(cdc_settings: ConnectionSettings, tables: str) -> None:
    name = f"{tables}.nouniq"
    report = _check(cdc_settings, [name], chunk_key_columns={name: ["id"]})
    assert _codes(report) == ["chunk_key_not_unique"]
    msg = report.problems[0].message
    assert "no UNIQUE index" in msg and "overwrite each other" in msg and "chunk_key_columns" in msg
    assert report.tables == []


def test_nullable_chunk_key_is_refused(cdc_settings: ConnectionSettings, tables: str) -> None:
    name = f"{tables}.nopk"
    report = _check(cdc_settings, [name], chunk_key_columns={name: ["n"]})
    assert _codes(report) == ["nullable_chunk_key"]
    msg = report.problems[0].message
    assert "nullable" in msg and "NOT NULL" in msg and f"{name}.n" in msg


# ------------------------------------------------------------------ the CLI
def _run_cli(env_conn: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "airflow-home"
    home.mkdir(exist_ok=True)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_") and not k.startswith("AIRFLOW__")
    }
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW_CONN_MYSQL_CDC_DEFAULT=env_conn,
    )
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_mysqlcdc", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_check_fails_with_the_message_on_stderr(mariadb: MariaDBServer, tables: str, tmp_path: Path) -> None:
    conn = mariadb.airflow_conn_json()
    res = _run_cli(conn, tmp_path, "check", "--tables", f"{tables}.good,{tables}.nopk")
    assert res.returncode == 1, res.stderr
    assert f"table {tables}.nopk has no primary key" in res.stderr
    assert "chunk_key_columns" in res.stderr
    assert "no primary key" not in res.stdout
    ok = _run_cli(
        conn, tmp_path, "check", "--tables", f"{tables}.good,{tables}.nopk", "--chunk-key", f"{tables}.nopk=id"
    )
    assert ok.returncode == 0, ok.stderr
    assert "source OK" in ok.stdout


def _assert_plan(out: str, db: str) -> list[dict[str, Any]]:
    plan = json.loads(out)
    assert isinstance(plan, list) and plan
    by_table: dict[str, list[dict[str, Any]]] = {}
    for d in plan:
        assert {"table", "split_id", "key_columns", "start", "end"} <= d.keys()
        by_table.setdefault(d["table"], []).append(d)
    assert set(by_table) == {f"{db}.good", f"{db}.dec_pk"}
    for name, splits in by_table.items():
        splits.sort(key=lambda d: d["split_id"])
        assert [d["split_id"] for d in splits] == list(range(len(splits)))
        assert len(splits) > 3, name  # 500 / 200 rows at chunk size 40
        assert splits[0]["start"] is None and splits[-1]["end"] is None
        for a, b in itertools.pairwise(splits):
            assert a["end"] == b["start"] is not None
    assert all(d["key_columns"] == ["id"] for d in by_table[f"{db}.good"])
    assert all(d["key_columns"] == ["d"] for d in by_table[f"{db}.dec_pk"])
    for d in by_table[f"{db}.good"][1:]:
        assert isinstance(d["start"][0], int)
    for d in by_table[f"{db}.dec_pk"][1:]:
        (v,) = d["start"]
        assert isinstance(v, str), "decimals travel as strings"
        Decimal(v)
    return plan


def test_cli_plan_prints_json_with_json_and_uri_connections(
    mariadb: MariaDBServer, tables: str, tmp_path: Path
) -> None:
    args = ("plan", "--tables", f"{tables}.good,{tables}.dec_pk", "--chunk-size", "40")
    res = _run_cli(mariadb.airflow_conn_json(), tmp_path, *args)
    assert res.returncode == 0, res.stderr
    plan = _assert_plan(res.stdout, tables)
    assert "planned" in res.stderr

    uri = f"mysql-cdc://{CDC_USER}:{CDC_PASSWORD}@127.0.0.1:{mariadb.port}?ssl=false"
    res_uri = _run_cli(uri, tmp_path, *args)
    assert res_uri.returncode == 0, res_uri.stderr
    assert _assert_plan(res_uri.stdout, tables) == plan


def test_cli_plan_refuses_a_failing_source(mariadb: MariaDBServer, tables: str, tmp_path: Path) -> None:
    res = _run_cli(mariadb.airflow_conn_json(), tmp_path, "plan", "--tables", f"{tables}.nopk", "--chunk-size", "10")
    assert res.returncode == 1
    assert res.stdout.strip() == ""
    assert "no primary key" in res.stderr


def test_cli_wrong_password_in_uri(mariadb: MariaDBServer, tmp_path: Path) -> None:
    uri = f"mysql-cdc://{CDC_USER}:wrong@127.0.0.1:{mariadb.port}?ssl=false"
    res = _run_cli(uri, tmp_path, "check")
    assert res.returncode == 1
    assert "refused login" in res.stderr and "password" in res.stderr


# ------------------------------------------------------------------ cascading foreign keys
@pytest.fixture
def fk_tables(mariadb: MariaDBServer, db: str) -> str:
    """Children of every referential action, and Sakila's payment → rental (ON DELETE SET NULL)."""
    mariadb.execute(
        "CREATE TABLE parent (id INT NOT NULL PRIMARY KEY)",
        "CREATE TABLE child_cascade (id INT NOT NULL PRIMARY KEY, parent_id INT NOT NULL, CONSTRAINT fk_cascade "
        "FOREIGN KEY (parent_id) REFERENCES parent (id) ON DELETE CASCADE ON UPDATE CASCADE)",
        "CREATE TABLE child_set_null (id INT NOT NULL PRIMARY KEY, parent_id INT NULL, CONSTRAINT fk_set_null "
        "FOREIGN KEY (parent_id) REFERENCES parent (id) ON DELETE SET NULL)",
        # MariaDB's InnoDB parses SET DEFAULT but stores RESTRICT (asserted below)
        "CREATE TABLE child_set_default (id INT NOT NULL PRIMARY KEY, parent_id INT NOT NULL DEFAULT 0, "
        "CONSTRAINT fk_set_default FOREIGN KEY (parent_id) REFERENCES parent (id) ON DELETE SET DEFAULT)",
        "CREATE TABLE child_restrict (id INT NOT NULL PRIMARY KEY, parent_id INT NOT NULL, CONSTRAINT fk_restrict "
        "FOREIGN KEY (parent_id) REFERENCES parent (id) ON DELETE RESTRICT ON UPDATE NO ACTION)",
        # as in Sakila
        "CREATE TABLE rental (rental_id INT NOT NULL PRIMARY KEY, rental_date DATETIME NOT NULL)",
        "CREATE TABLE payment (payment_id SMALLINT UNSIGNED NOT NULL PRIMARY KEY, rental_id INT DEFAULT NULL, "
        "amount DECIMAL(5,2) NOT NULL, KEY fk_payment_rental (rental_id), CONSTRAINT fk_payment_rental "
        "FOREIGN KEY (rental_id) REFERENCES rental (rental_id) ON DELETE SET NULL ON UPDATE CASCADE)",
        "INSERT INTO rental VALUES (1, '2005-05-24 22:53:30'), (2, '2005-05-24 22:54:33')",
        "INSERT INTO payment VALUES (1, 1, 2.99), (2, 2, 0.99)",
        database=db,
    )
    return db


_FK_TABLES = ["parent", "child_cascade", "child_set_null", "child_set_default", "child_restrict", "rental", "payment"]


def test_cascading_foreign_keys_are_warnings_not_problems(cdc_settings: ConnectionSettings, fk_tables: str) -> None:
    db = fk_tables
    report = _check(cdc_settings, [f"{db}.{t}" for t in _FK_TABLES])
    assert report.ok and report.problems == [], report.summary()
    by_table: dict[str, list[str]] = {}
    for w in report.warnings:
        assert w.code == "cascading_foreign_key"
        by_table.setdefault(str(w.table), []).append(w.message)
    # only children of engine-applied actions; never a parent, RESTRICT / NO ACTION, or MariaDB's SET DEFAULT
    assert sorted(by_table) == [f"{db}.child_cascade", f"{db}.child_set_null", f"{db}.payment"]
    assert by_table[f"{db}.payment"] == [
        f"{db}.payment.fk_payment_rental: ON DELETE SET NULL from {db}.rental — the engine sets "
        f"{db}.payment.rental_id to NULL without a binlog row event; the lake keeps the old value "
        '(see the README, "Foreign keys with cascading actions", for the choices)',
        f"{db}.payment.fk_payment_rental: ON UPDATE CASCADE from {db}.rental — the engine changes "
        f"{db}.payment.rental_id to the parent's new key without a binlog row event; the lake keeps the old value "
        '(see the README, "Foreign keys with cascading actions", for the choices)',
    ]
    cascade = by_table[f"{db}.child_cascade"]
    assert len(cascade) == 2
    assert cascade[0].startswith(f"{db}.child_cascade.fk_cascade: ON DELETE CASCADE from {db}.parent — ")
    assert f"the engine deletes {db}.child_cascade rows without a binlog row event; the lake keeps them" in cascade[0]
    assert cascade[1].startswith(f"{db}.child_cascade.fk_cascade: ON UPDATE CASCADE from {db}.parent — ")
    (set_null,) = by_table[f"{db}.child_set_null"]
    assert f"ON DELETE SET NULL from {db}.parent" in set_null and f"{db}.child_set_null.parent_id to NULL" in set_null
    # SET DEFAULT: MariaDB 10.11's InnoDB accepts the syntax and silently keeps RESTRICT, so nothing diverges
    assert "ON DELETE" not in _show_create(cdc_settings, f"{db}.child_set_default")
    # the warnings travel in the JSON form and the summary, and do not turn the report into a failure
    d = report.to_dict()
    assert d["ok"] is True and d["problems"] == []
    assert [w["message"] for w in d["warnings"]] == [w.message for w in report.warnings]
    summary = report.summary()
    assert summary.startswith("source OK") and "5 warning(s):" in summary
    assert all(w.message in summary for w in report.warnings)


def _show_create(settings: ConnectionSettings, table: str) -> str:
    with settings.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SHOW CREATE TABLE {table}")
        return str(cur.fetchone()[1])


def _fk_rules(settings: ConnectionSettings, db: str, constraint: str) -> list[tuple[Any, ...]]:
    with settings.connect() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT DELETE_RULE, UPDATE_RULE FROM information_schema.REFERENTIAL_CONSTRAINTS "
            "WHERE CONSTRAINT_SCHEMA = %s AND CONSTRAINT_NAME = %s",
            (db, constraint),
        )
        return list(cur.fetchall())


def test_rules_are_read_the_same_with_a_privilege_beyond_select(partial_user: Any, fk_tables: str) -> None:
    """MariaDB hides REFERENTIAL_CONSTRAINTS from a SELECT-only user (the CDC user: the rules then come
    from SHOW CREATE TABLE) and shows it to one with REFERENCES: both paths give the same warnings."""
    tables = [f"{fk_tables}.{t}" for t in _FK_TABLES]
    select_only = partial_user("SELECT, REPLICATION SLAVE, BINLOG MONITOR")
    with_references = partial_user("SELECT, REFERENCES, REPLICATION SLAVE, BINLOG MONITOR")
    assert _fk_rules(select_only, fk_tables, "fk_payment_rental") == []
    assert _fk_rules(with_references, fk_tables, "fk_payment_rental") == [("SET NULL", "CASCADE")]
    hidden, shown = _check(select_only, tables), _check(with_references, tables)
    assert hidden.ok and shown.ok
    assert len(hidden.warnings) == 5
    assert hidden.warnings == shown.warnings


def test_child_is_warned_when_its_parent_is_not_captured(cdc_settings: ConnectionSettings, fk_tables: str) -> None:
    report = _check(cdc_settings, [f"{fk_tables}.payment"])
    assert report.ok
    assert [w.table for w in report.warnings] == [f"{fk_tables}.payment"] * 2
    assert _check(cdc_settings, [f"{fk_tables}.rental"]).warnings == []  # the parent alone does not diverge


def test_the_binlog_really_misses_the_cascaded_change(mariadb: MariaDBServer, fk_tables: str) -> None:
    """The premise of the warning, on the real server: deleting a rental NULLs payment.rental_id in the
    engine, and the binlog holds row events for rental only."""
    db = fk_tables
    file, pos = mariadb.query("SHOW MASTER STATUS")[0][:2]
    mariadb.execute("DELETE FROM rental WHERE rental_id = 1", database=db)
    assert mariadb.query("SELECT payment_id, rental_id FROM payment ORDER BY 1", database=db) == [(1, None), (2, 2)]
    names: dict[str, str] = {}
    changed: set[str] = set()
    for event in mariadb.query(f"SHOW BINLOG EVENTS IN '{file}' FROM {pos}"):
        kind, info = event[2], str(event[5])
        if kind == "Table_map":
            table_id, _, name = info.removeprefix("table_id: ").partition(" ")
            names[table_id] = name.strip("()")
        elif kind.startswith(("Write_rows", "Update_rows", "Delete_rows")):
            changed.add(names[info.removeprefix("table_id: ").split(" ")[0]])
    assert changed == {f"{db}.rental"}


class _FakeConn:
    """Answers the foreign-key queries from canned rows (cases MariaDB 10.11 cannot produce)."""

    def __init__(self, answers: dict[str, list[tuple[Any, ...]]] | Exception):
        self.answers = answers
        self.rows: list[tuple[Any, ...]] = []

    def cursor(self) -> _FakeConn:
        return self

    def __enter__(self) -> _FakeConn:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, args: Any = None) -> None:
        if isinstance(self.answers, Exception):
            raise self.answers
        key = next(k for k in ("KEY_COLUMN_USAGE", "REFERENTIAL_CONSTRAINTS", "SHOW CREATE TABLE") if k in sql)
        self.rows = self.answers.get(key, [])

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def fetchone(self) -> tuple[Any, ...]:
        return self.rows[0]


def test_set_default_hidden_rules_and_unreadable_foreign_keys_without_a_server() -> None:
    """SET DEFAULT (MySQL's InnoDB refuses it, MariaDB's stores RESTRICT), rules read from SHOW CREATE
    TABLE under ANSI_QUOTES and with a quoted name, and a failing information_schema read."""
    from airflow_provider_mysqlcdc.mysql.checks import cascading_fk_warnings

    columns = [("fk_c", "other", "p", "a"), ("fk_c", "other", "p", "b")]
    (w,) = cascading_fk_warnings(
        _FakeConn({"KEY_COLUMN_USAGE": columns, "REFERENTIAL_CONSTRAINTS": [("fk_c", "SET DEFAULT", "RESTRICT")]}),
        ["s.c", "not-a-table-name"],
    )
    assert w.table == "s.c" and w.code == "cascading_foreign_key"
    assert w.message.startswith("s.c.fk_c: ON DELETE SET DEFAULT from other.p — the engine sets s.c.a, s.c.b to its ")

    ddl = (
        'CREATE TABLE "c" (\n  "a" int(11) DEFAULT NULL,\n'
        '  CONSTRAINT "fk ""q""" FOREIGN KEY ("a") REFERENCES "p" ("id") ON UPDATE SET NULL,\n'
        '  CONSTRAINT "fk_r" FOREIGN KEY ("a") REFERENCES "p" ("id")\n) ENGINE=InnoDB'
    )
    hidden = _FakeConn({
        "KEY_COLUMN_USAGE": [('fk "q"', "s", "p", "a"), ("fk_r", "s", "p", "a")],
        "REFERENTIAL_CONSTRAINTS": [],  # hidden from a SELECT-only user
        "SHOW CREATE TABLE": [("c", ddl)],
    })
    (u,) = cascading_fk_warnings(hidden, ["s.c"])
    assert u.message.startswith('s.c.fk "q": ON UPDATE SET NULL from s.p — the engine sets s.c.a to NULL')

    (e,) = cascading_fk_warnings(_FakeConn(pymysql.err.OperationalError(1142, "SELECT command denied")), ["s.c"])
    assert e.code == "foreign_keys_unreadable" and "SELECT command denied" in e.message
    assert cascading_fk_warnings(_FakeConn({}), []) == []


def test_cli_check_prints_the_warnings_and_exits_0(mariadb: MariaDBServer, fk_tables: str, tmp_path: Path) -> None:
    tables = f"{fk_tables}.rental,{fk_tables}.payment"
    res = _run_cli(mariadb.airflow_conn_json(), tmp_path, "check", "--tables", tables)
    assert res.returncode == 0, res.stderr
    assert "source OK" in res.stdout and "2 warning(s):" in res.stdout
    assert f"{fk_tables}.payment.fk_payment_rental: ON DELETE SET NULL from {fk_tables}.rental" in res.stdout
    as_json = _run_cli(mariadb.airflow_conn_json(), tmp_path, "check", "--json", "--tables", tables)
    assert as_json.returncode == 0, as_json.stderr
    d = json.loads(as_json.stdout)
    assert d["ok"] is True and d["problems"] == []
    assert [(w["code"], w["table"]) for w in d["warnings"]] == [("cascading_foreign_key", f"{fk_tables}.payment")] * 2
    assert "ON DELETE SET NULL" in d["warnings"][0]["message"]
    # plan: the JSON plan on stdout stays clean, the warnings go to stderr
    plan = _run_cli(mariadb.airflow_conn_json(), tmp_path, "plan", "--tables", tables, "--chunk-size", "1")
    assert plan.returncode == 0, plan.stderr
    assert {d["table"] for d in json.loads(plan.stdout)} == {f"{fk_tables}.rental", f"{fk_tables}.payment"}
    assert "fk_payment_rental: ON DELETE SET NULL" in plan.stderr


def test_plan_operator_logs_the_warnings_and_plans(
    fk_tables: str, airflow_conn_env: str, tmp_path: Path
) -> None:
    from airflow_provider_mysqlcdc.operators.plan import MySqlCdcPlanOperator

    tables = [f"{fk_tables}.rental", f"{fk_tables}.payment"]
    op = MySqlCdcPlanOperator(
        task_id="plan", pipeline_id="fk", sink_root=str(tmp_path / "sink"), state_root=str(tmp_path / "state"),
        tables=tables,
    )
    logged: list[tuple[str, str]] = []

    class Log:
        def info(self, msg: str, *args: Any) -> None:
            logged.append(("info", msg % args))

        def warning(self, msg: str, *args: Any) -> None:
            logged.append(("warning", msg % args))

    class TI:
        def xcom_push(self, key: str, value: Any) -> None:
            pass

    op._cached_logger = Log()  # type: ignore[assignment]
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    pipeline_log = logging.getLogger("airflow_provider_mysqlcdc.pipeline")
    pipeline_log.addHandler(handler)
    try:
        groups = op.execute({"ti": TI(), "run_id": "manual__fk"})
    finally:
        pipeline_log.removeHandler(handler)
    assert groups  # the warnings do not stop the plan
    # logged once, by the plan (pipeline.plan_run); the operator does not repeat them (issue 33 item 8g)
    assert not [m for level, m in logged if level == "warning"]
    warned = [r.getMessage() for r in records if "fk_payment_rental" in r.getMessage()]
    assert [m.split(":", 1)[0] for m in warned] == ["source check warning"] * 2
    assert f"ON DELETE SET NULL from {fk_tables}.rental" in warned[0]
    assert f"ON UPDATE CASCADE from {fk_tables}.rental" in warned[1]
