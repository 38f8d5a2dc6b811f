"""The lake's object-store credentials from an Airflow connection (``storage_conn_id``).

Why a connection: keys belong in Airflow's secrets backend, not in DAG code or Spark confs. An
Amazon connection (type ``aws``, e.g. ``aws_default``) gives the access key (login), the secret
key (password) and, in its extra, ``region_name``, ``endpoint_url`` (an S3-compatible server) and
``aws_session_token``. Any connection may also carry ``storage_options`` in its extra: delta-rs
storage options, passed as they are (GCS, Azure, or S3 settings the fields above do not cover).
The result reaches Spark jobs in the environment (``MYSQLCDC_STORAGE``), never on a command line.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_mysqlcdc.storage import LakeStorage


class ObjectStorageError(ValueError):
    """The storage connection is missing or malformed; the message names the fix."""


def storage_from_connection(conn: Any) -> LakeStorage:
    """A :class:`LakeStorage` from an Airflow connection object (pure: no lookup)."""
    extra = conn.extra_dejson if hasattr(conn, "extra_dejson") else dict(getattr(conn, "extra", None) or {})
    options: dict[str, str] = {}
    if conn.login:
        options["aws_access_key_id"] = str(conn.login)
    if conn.password:
        options["aws_secret_access_key"] = str(conn.password)
    endpoint = extra.get("endpoint_url") or (extra.get("service_config", {}).get("s3", {}) or {}).get("endpoint_url")
    if endpoint:
        options["aws_endpoint_url"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            options["aws_allow_http"] = "true"
    if extra.get("region_name"):
        options["aws_region"] = str(extra["region_name"])
    if extra.get("aws_session_token"):
        options["aws_session_token"] = str(extra["aws_session_token"])
    more = extra.get("storage_options") or {}
    if not isinstance(more, dict):
        raise ObjectStorageError(
            f"connection {conn.conn_id!r}: extra 'storage_options' must be a JSON object of delta-rs storage options"
        )
    options.update({str(k): str(v) for k, v in more.items()})
    return LakeStorage(options)


def given_conn_id(conn_id: Any) -> str | None:
    """A connection id, or None when it is unset: None, empty, or the text ``None`` / ``null`` that an
    unset (nullable) DAG param renders to in a DAG without ``render_template_as_native_obj``."""
    text = "" if conn_id is None else str(conn_id).strip()
    return None if text in ("", "None", "null") else text


def lake_storage(conn_id: str | None) -> LakeStorage:
    """The storage of ``conn_id``; no connection id means the library defaults (a local lake, or
    credentials from the machine: instance role, ``~/.aws``, environment)."""
    conn_id = given_conn_id(conn_id)
    if not conn_id:
        return LakeStorage()
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:
        raise ObjectStorageError(
            f"storage connection {conn_id!r} is not defined: create it (type aws: login = access key id, password = "
            "secret key, extra {\"endpoint_url\": ..., \"region_name\": ...}), or leave storage_conn_id unset to use "
            f"the machine's credentials ({type(exc).__name__})"
        ) from None
    return storage_from_connection(conn)


__all__ = ["ObjectStorageError", "given_conn_id", "lake_storage", "storage_from_connection"]
