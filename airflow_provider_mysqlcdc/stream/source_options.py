"""The ``mysql_binlog`` source's options: integers with their bounds, secrets that may come from the
environment, and the stream manifest the options point to (``stream/spark_source.py``)."""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.storage import LakeStorage


def int_option(options: Any, name: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name}={raw!r} of the mysql_binlog source must be an integer") from None
    if value < minimum:
        raise ValueError(f"option {name}={value} of the mysql_binlog source must be >= {minimum}")
    return value


def secret_option(options: Any, name: str, env_option: str) -> str | None:
    """Option ``name``, or the environment variable named by option ``env_option`` (a job started by
    spark-submit has its secrets in its environment; options show in query plans and event logs)."""
    env = options.get(env_option)
    if env:
        value = os.environ.get(str(env))
        if not value:
            raise ValueError(f"option {env_option} of the mysql_binlog source names ${env}, which is not set")
        return value
    value = options.get(name)
    return None if value is None else str(value)


def read_manifest(path: str, storage: LakeStorage) -> Manifest:
    """Read the manifest file (local path or object-store URL) on the driver."""
    try:
        text = storage.read_bytes(path).decode("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"stream manifest {path} does not exist: build it from the snapshot (the stream operator writes it)"
        ) from None
    return Manifest.from_json(text)


__all__ = ["int_option", "read_manifest", "secret_option"]
