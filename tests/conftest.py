"""Shared fixtures: a private MariaDB with a ROW binlog, per-test databases, Airflow env.

The server is session-scoped (starting one takes ~1 s); tests that must reconfigure or restart a
server start their own with ``MariaDBServer`` so they never disturb the shared one. ``mysql97`` and
``mariadb118`` run MySQL 9.7 and MariaDB 11.8 from Debian roots (``tests/support/servers.py``),
started only for the tests that ask for them; ``server`` runs a test on each of the three.
``mariadb_pair``, ``mariadb118_pair`` and ``mysql_pair`` are a primary and its GTID replica
(``tests/support/replication.py``), one per module: a failover test consumes its pair.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator

import pytest

# Airflow must never touch a real deployment from the tests, nor load its example DAGs.
_AIRFLOW_HOME = tempfile.mkdtemp(prefix="mysqlcdc-airflow-home-")
os.environ.setdefault("AIRFLOW_HOME", _AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault(
    "AIRFLOW__CORE__DAGS_FOLDER", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dags")
)

# The tests' Spark JVMs (the session's, every spark-submit of a job) live seconds to minutes: the C2
# compiler's threads would take a quarter of their CPU on two cores for code that barely gets hot.
# Only the tests run so; a deployment keeps the JVM's default.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings  # noqa: E402
from tests.support.mariadb import MariaDBServer  # noqa: E402
from tests.support.replication import ReplicaPair, replica_pair  # noqa: E402
from tests.support.servers import RootServer, start_server  # noqa: E402

# The servers a test parametrised by ``server`` runs on: the machine's MariaDB 10.11 (fixture
# ``mariadb``) and the two from Debian roots.
SERVER_NAMES = ["mariadb1011", "mariadb118", "mysql97"]


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    server = MariaDBServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def mysql97() -> Iterator[RootServer]:
    """MySQL 9.7 with ROW binlog, full row metadata and GTID mode on, server default collation
    (utf8mb4_0900_ai_ci); started on first use (~6 s the first time in a process, ~3 s after)."""
    server = start_server("mysql97")
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def mariadb118() -> Iterator[RootServer]:
    """MariaDB 11.8 with ROW binlog and full row metadata, server default collation
    (utf8mb4_uca1400_ai_ci); started on first use (~2 s)."""
    server = start_server("mariadb118")
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(params=SERVER_NAMES)
def server(request: pytest.FixtureRequest) -> MariaDBServer:
    """Each of the three servers in turn (the session's shared one of each flavour)."""
    name = "mariadb" if request.param == "mariadb1011" else request.param
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def private_server() -> Iterator[MariaDBServer]:
    """A server of the module's own: for tests that purge binlogs or change global settings."""
    server = MariaDBServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def mariadb_pair() -> Iterator[ReplicaPair]:
    """A MariaDB 10.11 primary and its GTID replica (``tests/support/replication.py``), the module's
    own: a failover consumes the pair."""
    with replica_pair("mariadb1011") as pair:
        yield pair


@pytest.fixture(scope="module")
def mariadb118_pair() -> Iterator[ReplicaPair]:
    """A MariaDB 11.8 primary and its GTID replica, the module's own."""
    with replica_pair("mariadb118") as pair:
        yield pair


@pytest.fixture(scope="module")
def mysql_pair() -> Iterator[ReplicaPair]:
    """A MySQL 9.7 primary and its GTID (auto-position) replica, the module's own."""
    with replica_pair("mysql97") as pair:
        yield pair


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """The metadata DB of the private AIRFLOW_HOME, for ``dag.test()`` (migrated once, ~4 s)."""
    from tests.support.airflow_env import migrate_db

    migrate_db()


@pytest.fixture
def db(mariadb: MariaDBServer) -> Iterator[str]:
    """A fresh database on the shared server, dropped after the test."""
    name = "t_" + uuid.uuid4().hex[:10]
    mariadb.execute(f"CREATE DATABASE `{name}`")
    try:
        yield name
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def cdc_settings(mariadb: MariaDBServer) -> ConnectionSettings:
    """How the CDC user reaches the shared server (TLS off: it is a local test server)."""
    return mariadb.cdc_settings()


@pytest.fixture
def cdc_conn(cdc_settings: ConnectionSettings):  # type: ignore[no-untyped-def]
    conn = cdc_settings.connect()
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def airflow_conn_env(mariadb: MariaDBServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """``AIRFLOW_CONN_MYSQL_CDC_DEFAULT`` pointing at the shared server, as a user would set it."""
    value = mariadb.airflow_conn_json()
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_CDC_DEFAULT", value)
    return value


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local[2] Spark session for the whole run (JVM start-up is the slow part)."""
    from airflow_provider_mysqlcdc.spark_session import build_spark_session

    session = build_spark_session("mysqlcdc-tests", master="local[2]")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def s3_server():  # type: ignore[no-untyped-def]
    """moto's S3 server on 127.0.0.1 with one bucket (``tests/support/s3_server.py``; starts in ~1.5 s)."""
    from tests.support.s3_server import S3Server

    server = S3Server()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def spark_cluster():  # type: ignore[no-untyped-def]
    """A standalone Spark master and two 1-core workers (``tests/support/spark_cluster.py``; ~10 s to start)."""
    from tests.support.spark_cluster import SparkCluster

    cluster = SparkCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.destroy()

