"""The CLI finds a connection wherever Airflow keeps it, as a user runs it (a subprocess).

Environment variables are covered by tests/integration/test_checks.py; here: a connection created
in the metadata DB the way the UI creates it (the ORM), one in a secrets backend, and one that is
nowhere (the error names each place searched and the fix). The subprocess gets the test process's
AIRFLOW_HOME and settings, minus every ``AIRFLOW_CONN_*``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mariadb import CDC_PASSWORD, CDC_USER, MariaDBServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _env(drop_prefixes: tuple[str, ...] = ("AIRFLOW_CONN_",), **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes)}
    env.update(extra)
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_mysqlcdc", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )


def _conn_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def ui_connection(airflow_db: None, mariadb: MariaDBServer) -> Iterator[str]:
    """A ``mysql_cdc`` connection in the private metadata DB, written through the ORM as the UI does
    (the password encrypted with the deployment's Fernet key, the TLS mode as the form stores it)."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    conn_id = _conn_id("mysqlcdc_ui")
    with create_session() as session:
        session.add(Connection(
            conn_id=conn_id, conn_type="mysql_cdc", description="created in the UI", host="127.0.0.1",
            port=mariadb.port, login=CDC_USER, password=CDC_PASSWORD,
            extra=json.dumps({"ssl": "preferred", "server_id_range": "5400-6400"}),
        ))
    try:
        yield conn_id
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id == conn_id).delete()


def _fernet_env() -> dict[str, str]:
    """The test process's Fernet key: a deployment keeps it in airflow.cfg, Airflow's unit-test mode
    generates one per process, so the CLI gets it the way a deployment's processes share it."""
    from airflow.configuration import conf

    return {"AIRFLOW__CORE__FERNET_KEY": conf.get("core", "fernet_key")}


def test_check_finds_a_connection_created_in_the_ui(ui_connection: str, mariadb: MariaDBServer, db: str) -> None:
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT NOT NULL PRIMARY KEY)")
    res = _cli(_env(**_fernet_env()), "check", "--json", "--conn-id", ui_connection, "--tables", f"{db}.t")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)  # nothing but the report on stdout
    assert report["ok"] is True and report["tables"] == [f"{db}.t"]
    assert report["offset"].startswith("mysql-bin.")
    assert "Traceback" not in res.stderr
    # another Fernet key cannot decrypt it: the error says so and names the setting
    wrong_key = _cli(_env(AIRFLOW__CORE__FERNET_KEY=_other_fernet_key()), "check", "--conn-id", ui_connection)
    assert wrong_key.returncode == 1
    assert "could not be read (InvalidToken" in wrong_key.stderr and "AIRFLOW__CORE__FERNET_KEY" in wrong_key.stderr
    assert "Traceback" not in wrong_key.stderr


def _other_fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def test_check_finds_a_connection_in_a_secrets_backend(mariadb: MariaDBServer, tmp_path: Path) -> None:
    conn_id = _conn_id("mysqlcdc_secret")
    path = tmp_path / "connections.json"
    path.write_text(json.dumps({conn_id: {
        "conn_type": "mysql_cdc", "host": "127.0.0.1", "port": mariadb.port, "login": CDC_USER,
        "password": CDC_PASSWORD, "extra": json.dumps({"ssl": "disabled"}),
    }}))
    env = _env(
        AIRFLOW__SECRETS__BACKEND="airflow.secrets.local_filesystem.LocalFilesystemBackend",
        AIRFLOW__SECRETS__BACKEND_KWARGS=json.dumps({"connections_file_path": str(path)}),
    )
    res = _cli(env, "check", "--conn-id", conn_id)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("source OK")


def test_a_connection_that_is_nowhere_names_each_place_and_the_fix(airflow_db: None) -> None:
    conn_id = _conn_id("mysqlcdc_missing")
    res = _cli(_env(), "check", "--conn-id", conn_id)
    assert res.returncode == 1
    assert res.stdout == ""
    err = res.stderr
    assert f"error: connection {conn_id!r} was not found where Airflow looks" in err
    assert f"environment variable AIRFLOW_CONN_{conn_id.upper()}: not set" in err
    assert "metadata DB " in err and f"(AIRFLOW_HOME={os.environ['AIRFLOW_HOME']}): not there" in err
    assert "Admin → Connections" in err and f"airflow connections add {conn_id} --conn-json" in err
    assert "Traceback" not in err


def test_an_unreadable_metadata_db_is_named_with_the_fix(tmp_path: Path) -> None:
    """A CLI pointed at another AIRFLOW_HOME (here: a fresh one, never migrated) says so."""
    home = tmp_path / "airflow-home"
    home.mkdir()
    env = _env(("AIRFLOW_CONN_", "AIRFLOW__DATABASE__"), AIRFLOW_HOME=str(home))
    res = _cli(env, "check", "--conn-id", "mysql_cdc_default")
    assert res.returncode == 1
    assert f"(AIRFLOW_HOME={home}): could not be read" in res.stderr
    assert "run `airflow db migrate`" in res.stderr
    assert "Traceback" not in res.stderr
