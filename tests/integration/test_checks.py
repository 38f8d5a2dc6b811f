"""check_source against REAL misconfigured servers, users and tables, and the CLI as a user runs it.

Every failure here is produced by the real thing: a private MariaDB restarted with the wrong binlog
settings, users created with partial grants, tables without a usable chunk key. Each test asserts
the problem code and that the message names the fix, and where cheap applies that fix and checks
that the problem goes away.
"""

from __future__ import annotations

import itertools
import json
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

from airflow_provider_mysqlcdc.source.checks import SourceReport, check_source
from airflow_provider_mysqlcdc.source.connection import ConnectionSettings
from airflow_provider_mysqlcdc.testing.mariadb import CDC_PASSWORD, CDC_USER, MariaDBServer, ServerSettings

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
    assert "--log-bin" in msg and "binlog_format=ROW" in msg and "restart" in msg
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
        f"CREATE TABLE `{db}`.nopk (id INT NOT NULL, n INT NULL, v VARCHAR(20))",
        f"CREATE TABLE `{db}`.dec_pk (d DECIMAL(20,4) NOT NULL PRIMARY KEY, v INT)",
        f"INSERT INTO `{db}`.good SELECT seq, CONCAT('v', seq) FROM seq_1_to_500",
        f"INSERT INTO `{db}`.nopk SELECT seq, IF(seq % 10 = 0, NULL, seq), 'x' FROM seq_1_to_50",
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
    # configuring a NOT NULL chunk key fixes it
    fixed = _check(cdc_settings, [name], chunk_key_columns={name: ["id"]})
    assert fixed.ok, fixed.summary()
    assert fixed.tables == [name]


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
