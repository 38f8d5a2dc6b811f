"""The server matrix itself (issue 34): MariaDB 10.11, MariaDB 11.8 and MySQL 9.7 each start with
the settings CDC needs, and the provider's own pre-flight check and offset reading work on them.

Later suites take the ``server`` fixture to run on all three; this file proves the fixtures give
what those suites assume (version, ROW binlog with full metadata, GTID, each server's default
collation, a CDC user the provider can log in as).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_mysqlcdc.mysql.binlog_reader import ONE_SHOT_SERVER_ID, BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.checks import check_source
from airflow_provider_mysqlcdc.mysql.server import current_offset, server_info, variables
from tests.support.mariadb import MariaDBServer
from tests.support.servers import MYSQL97, ROOTS_ENV, RootServer, ServerRootMissingError

pytestmark = pytest.mark.integration

# What each fixture server is: major.minor, and the collation a new utf8mb4 table gets. MariaDB
# 10.11's fixture sets collation-server=utf8mb4_general_ci; the two others keep their server's default.
EXPECTED = {
    "mariadb1011": ((10, 11), "utf8mb4_general_ci"),
    "mariadb118": ((11, 8), "utf8mb4_uca1400_ai_ci"),
    "mysql97": ((9, 7), "utf8mb4_0900_ai_ci"),
}


def _name(server: MariaDBServer) -> str:
    return server.flavour.name if isinstance(server, RootServer) else "mariadb1011"


@pytest.fixture
def server_db(server: MariaDBServer) -> Iterator[str]:
    name = "t_" + uuid.uuid4().hex[:10]
    server.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        yield name
    finally:
        server.execute(f"DROP DATABASE IF EXISTS `{name}`")


def test_version_is_the_expected_major_minor(server: MariaDBServer) -> None:
    with server.cdc_settings().connect() as conn:
        info = server_info(conn)
    assert (info.major, info.minor) == EXPECTED[_name(server)][0], info.version
    assert info.is_mariadb == _name(server).startswith("mariadb")


def test_binlog_is_row_with_full_metadata_and_gtid_on(server: MariaDBServer, server_db: str) -> None:
    with server.cdc_settings().connect() as conn:
        v = variables(conn, ["log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata",
                             "gtid_mode", "enforce_gtid_consistency"])
    assert (v["log_bin"], v["binlog_format"], v["binlog_row_image"], v["binlog_row_metadata"]) == (
        "ON", "ROW", "FULL", "FULL"
    )
    if _name(server) == "mysql97":
        assert (v["gtid_mode"], v["enforce_gtid_consistency"]) == ("ON", "ON")
    else:  # MariaDB always writes GTIDs: a committed write shows in gtid_binlog_pos
        server.execute("CREATE TABLE g (k INT PRIMARY KEY)", "INSERT INTO g VALUES (1)", database=server_db)
        assert server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]


def test_new_utf8mb4_table_gets_the_servers_default_collation(server: MariaDBServer, server_db: str) -> None:
    server.execute(
        "CREATE TABLE ai_keys (k VARCHAR(40) PRIMARY KEY, v INT NOT NULL) DEFAULT CHARSET=utf8mb4", database=server_db
    )
    rows = server.query(
        "SELECT TABLE_COLLATION FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'ai_keys'",
        (server_db,),
    )
    assert rows[0][0] == EXPECTED[_name(server)][1]


def test_provider_check_passes_for_the_cdc_user(server: MariaDBServer, server_db: str) -> None:
    server.execute(
        "CREATE TABLE ai_keys (k VARCHAR(40) PRIMARY KEY, v INT NOT NULL) DEFAULT CHARSET=utf8mb4",
        "CREATE TABLE n (id BIGINT PRIMARY KEY, s VARCHAR(20))",
        database=server_db,
    )
    with server.cdc_settings().connect() as conn:
        report = check_source(conn, [f"{server_db}.ai_keys", f"{server_db}.n"])
    assert report.ok, report.summary()
    assert report.tables == [f"{server_db}.ai_keys", f"{server_db}.n"]
    assert report.is_mariadb == _name(server).startswith("mariadb")


def test_current_offset_follows_writes_and_carries_the_gtid_set(server: MariaDBServer, server_db: str) -> None:
    server.execute("CREATE TABLE w (k INT PRIMARY KEY)", database=server_db)
    with server.cdc_settings().connect() as conn:
        before = current_offset(conn)
        server.execute("INSERT INTO w VALUES (1)", database=server_db)
        after = current_offset(conn)
    assert after.sort_key() > before.sort_key()
    assert after.gtid_set and after.gtid_set != before.gtid_set
    if _name(server) == "mysql97":
        uuid_ = server.query("SELECT @@server_uuid")[0][0]
        assert uuid_ in after.gtid_set


def test_mysql_cdc_user_logs_in_with_caching_sha2_password_with_and_without_tls(mysql97: RootServer) -> None:
    rows = mysql97.query("SELECT plugin FROM mysql.user WHERE user = 'cdc'")
    assert rows == [("caching_sha2_password",)]
    plain = mysql97.cdc_settings()  # ssl=False: the password travels RSA-encrypted with the server's key
    with plain.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        assert cur.fetchone()[1] == ""
    plain.ssl = True
    with plain.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        assert cur.fetchone()[1] != ""


def test_a_missing_root_names_the_command_to_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    with pytest.raises(ServerRootMissingError, match="make server-roots"):
        RootServer(MYSQL97)


def test_binlog_reader_reads_full_row_images(server: MariaDBServer, server_db: str) -> None:
    """MySQL pads a rows event's column bitmap with 1 bits, MariaDB with 0: both are full images."""
    server.execute("CREATE TABLE r (k VARCHAR(10) PRIMARY KEY, v INT NOT NULL)", database=server_db)
    with server.cdc_settings().connect() as conn:
        start = current_offset(conn)
        server.execute(
            "INSERT INTO r VALUES ('a', 1), ('b', 2)",
            "UPDATE r SET v = 3 WHERE k = 'a'",
            "DELETE FROM r WHERE k = 'b'",
            database=server_db,
        )
        end = current_offset(conn)
    table = f"{server_db}.r"
    with BinlogRangeReader(server.cdc_settings(), start, end, [table], ONE_SHOT_SERVER_ID) as reader:
        got = [(c.before, c.after) for c in reader]
    assert got == [
        (None, {"k": "a", "v": 1}),
        (None, {"k": "b", "v": 2}),
        ({"k": "a", "v": 1}, {"k": "a", "v": 3}),
        ({"k": "b", "v": 2}, None),
    ]
    assert reader.position == end
