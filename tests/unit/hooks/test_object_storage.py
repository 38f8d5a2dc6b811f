"""The lake's credentials from an Airflow connection: an Amazon connection's fields, or storage_options."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_provider_mysqlcdc.hooks.object_storage import ObjectStorageError, lake_storage, storage_from_connection


def _conn(login: str | None = None, password: str | None = None, extra: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(conn_id="c", login=login, password=password, extra_dejson=extra or {})


def test_an_amazon_connection_against_an_s3_compatible_server() -> None:
    extra = {"endpoint_url": "http://127.0.0.1:9000", "region_name": "us-east-1"}
    conn = _conn(login="AKIA1", password="sk", extra=extra)
    assert dict(storage_from_connection(conn).options) == {
        "aws_access_key_id": "AKIA1",
        "aws_secret_access_key": "sk",
        "aws_endpoint_url": "http://127.0.0.1:9000",
        "aws_allow_http": "true",
        "aws_region": "us-east-1",
    }


def test_storage_options_in_the_extra_pass_through_and_win() -> None:
    extra = {"storage_options": {"azure_storage_account_name": "acct", "aws_region": "x"}, "region_name": "y"}
    conn = _conn(extra=extra)
    assert dict(storage_from_connection(conn).options) == {"azure_storage_account_name": "acct", "aws_region": "x"}
    with pytest.raises(ObjectStorageError, match="must be a JSON object"):
        storage_from_connection(_conn(extra={"storage_options": "nope"}))


def test_no_connection_means_the_machines_credentials_and_a_missing_one_names_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert lake_storage(None).options == {} and lake_storage("").options == {}
    with pytest.raises(ObjectStorageError, match="storage connection 'nope' is not defined"):
        lake_storage("nope")
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "aws", "login": "A", "password": "S"}))
    assert lake_storage("lake").options["aws_secret_access_key"] == "S"
