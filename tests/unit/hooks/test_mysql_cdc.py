"""MySqlCdcHook: an Airflow connection (URI or JSON form) becomes the settings the jobs receive.

The TLS modes' every spelling is in ``tests/unit/hooks/test_mysql_cdc_tls.py``; here the whole path runs:
environment variable -> Airflow connection -> hook -> ``ConnectionSettings``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook
from airflow_provider_mysqlcdc.mysql.connection import DEFAULT_SERVER_ID_RANGE, ConnectionSettings


def _settings(monkeypatch: pytest.MonkeyPatch, value: str, conn_id: str = "cdc_test") -> ConnectionSettings:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", value)
    return MySqlCdcHook(conn_id).settings


def _json(**fields: Any) -> str:
    return json.dumps({"conn_type": "mysql_cdc", **fields})


def test_json_form(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"ssl": "required", "ssl_ca": "/etc/ca.pem", "server_id_range": "6000-6100"}
    conn = _json(host="db.example", port=3307, login="cdc", password="pw", schema="shop", extra=extra)
    s = _settings(monkeypatch, conn)
    assert (s.host, s.port, s.user, s.password, s.database) == ("db.example", 3307, "cdc", "pw", "shop")
    assert s.ssl is True and s.ssl_ca == "/etc/ca.pem" and s.server_id_range == (6000, 6100)


def test_uri_form_with_escaped_password_and_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings(monkeypatch, "mysql-cdc://cdc:p%40ss%2Fw@db.example:3308/shop?ssl=disabled&server_id_range=7000-7010")
    assert (s.host, s.port, s.user, s.password, s.database) == ("db.example", 3308, "cdc", "p@ss/w", "shop")
    assert s.ssl is False and s.server_id_range == (7000, 7010)


def test_defaults_for_a_bare_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings(monkeypatch, _json())
    assert (s.host, s.port, s.user, s.password, s.database) == ("127.0.0.1", 3306, "root", "", None)
    assert s.ssl is None and s.ssl_ca is None and s.server_id_range == DEFAULT_SERVER_ID_RANGE


@pytest.mark.parametrize(
    ("extra", "ssl"),
    [({"ssl": "preferred"}, None), ({"ssl": "required"}, True), ({"ssl": "disabled"}, False), ({"ssl": True}, True),
     ({"ssl": "false"}, False), ({}, None)],
)
def test_tls_states(monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], ssl: bool | None) -> None:
    assert _settings(monkeypatch, _json(host="h", extra=extra)).ssl is ssl


def test_server_id_range_as_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings(monkeypatch, _json(extra={"server_id_range": [9000, 9100]})).server_id_range == (9000, 9100)


@pytest.mark.parametrize(("extra", "match"), [({"server_id_range": "6000"}, "5400-6400"),
                                              ({"ssl": "sometimes"}, "TLS field")])
def test_bad_extras_name_the_fix(monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _settings(monkeypatch, _json(extra=extra))


def test_the_settings_survive_the_trip_to_a_spark_job(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings(monkeypatch, _json(host="h", port=3310, login="u", password="pw", extra={"ssl": "required"}))
    assert ConnectionSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_the_hook_is_registered_for_its_connection_type() -> None:
    from airflow_provider_mysqlcdc.get_provider_info import get_provider_info

    (conn_type,) = get_provider_info()["connection-types"]
    assert conn_type["connection-type"] == MySqlCdcHook.conn_type == "mysql_cdc"
    assert conn_type["hook-class-name"] == f"{MySqlCdcHook.__module__}.{MySqlCdcHook.__qualname__}"
    assert set(conn_type["conn-fields"]) == {"ssl", "ssl_ca", "server_id_range"}
