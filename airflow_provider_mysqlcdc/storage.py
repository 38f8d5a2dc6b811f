"""Where the lake and the pipeline state live — a local directory or an object store — and how to reach it.

Why one module: Spark's JVM cannot reach an object store without a connector jar (pyspark ships
no ``hadoop-aws``), so every byte this provider writes to S3, GCS or ADLS goes through Python —
fsspec for files (staged chunks, state documents, the stream's checkpoint copy) and delta-rs for
Delta commits. The two libraries name the same credentials differently; :class:`LakeStorage`
holds them once, in delta-rs' names, and gives each library its own form. A local path needs
none of it and keeps the plain ``os`` calls.

Credentials travel to a Spark job as JSON in the environment variable :data:`STORAGE_ENV`, never
on a command line, and inside pickled task closures to the executors, never in a Spark conf (the
Spark UI and event logs show confs). ``repr`` of a :class:`LakeStorage` hides every value.
See docs/architecture.md, "Object storage".
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STORAGE_ENV = "MYSQLCDC_STORAGE"
PROBE_PREFIX = ".mysqlcdc-write-probe-"
# An unreachable S3 endpoint must fail the plan in seconds, not after botocore's default 60 s
# connect timeout times its retries.
_PROBE_S3_CONFIG = {"connect_timeout": 5, "read_timeout": 20, "retries": {"max_attempts": 2}}

# delta-rs (object_store) key -> s3fs argument
_S3FS_KEYS = {
    "aws_access_key_id": "key",
    "aws_secret_access_key": "secret",
    "aws_session_token": "token",
    "aws_endpoint_url": "endpoint_url",
}


def is_local(url: str) -> bool:
    """A plain path or ``file://`` URL (the embedded default) rather than an object store."""
    return "://" not in str(url) or str(url).startswith("file://")


def local_path(url: str) -> str:
    return str(url)[len("file://") :] if str(url).startswith("file://") else str(url)


def protocol(url: str) -> str:
    return "file" if is_local(url) else str(url).split("://", 1)[0].lower()


@dataclass(frozen=True)
class LakeStorage:
    """Credentials and settings of the object store holding ``sink_root`` and ``state_root``.

    ``options`` uses delta-rs' storage option names (``aws_access_key_id``,
    ``aws_secret_access_key``, ``aws_endpoint_url``, ``aws_region``, ``aws_allow_http``, ...).
    Empty options mean the library defaults (instance roles, ``~/.aws``, environment variables).
    """

    options: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"LakeStorage(options={sorted(self.options)!r})"  # names only: never a secret in a log

    # ----------------------------------------------------------------- transport
    def to_json(self) -> str:
        return json.dumps(dict(self.options), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> LakeStorage:
        if not text:
            return cls()
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{STORAGE_ENV} must hold a JSON object of storage options")
        return cls({str(k): str(v) for k, v in data.items() if v is not None})

    @classmethod
    def from_env(cls, name: str = STORAGE_ENV) -> LakeStorage:
        """The storage a Spark job was given (``{}`` when the lake is local or uses library defaults)."""
        return cls.from_json(os.environ.get(name))

    # ----------------------------------------------------------------- per library
    def delta_options(self, url: str) -> dict[str, str] | None:
        """delta-rs' ``storage_options`` for ``url``.

        On S3, commits are made safe for concurrent writers (parallel snapshot groups, the stream)
        by S3's conditional writes (``If-None-Match``): delta-rs' ``conditional_put=etag``, which
        AWS S3 and the common S3-compatible servers support; no DynamoDB lock table is needed.
        """
        if is_local(url):
            return dict(self.options) or None
        out = dict(self.options)
        if protocol(url) in ("s3", "s3a"):
            out.setdefault("conditional_put", "etag")
        return out

    def fsspec_options(self, url: str) -> dict[str, Any]:
        """fsspec's arguments for ``url``'s filesystem (s3fs' names for S3; others as given)."""
        if is_local(url):
            return {}
        if protocol(url) not in ("s3", "s3a"):
            return dict(self.options)
        out: dict[str, Any] = {"use_listings_cache": False}  # other processes write the same prefixes
        client: dict[str, Any] = {}
        for key, value in self.options.items():
            k = key.lower()
            if k in _S3FS_KEYS:
                out[_S3FS_KEYS[k]] = value
            elif k in ("aws_region", "region"):
                client["region_name"] = value
        if client:
            out["client_kwargs"] = client
        return out

    def filesystem(self, url: str) -> tuple[Any, str]:
        """``(fsspec filesystem, path)`` for an object-store URL."""
        from fsspec.core import url_to_fs

        fs, path = url_to_fs(str(url), **self.fsspec_options(url))
        return fs, path

    # ----------------------------------------------------------------- file operations
    def makedirs(self, url: str) -> None:
        if is_local(url):
            os.makedirs(local_path(url), exist_ok=True)  # object stores have no directories

    def listdir(self, url: str) -> list[str]:
        """The names in a directory (``[]`` if it does not exist)."""
        if is_local(url):
            base = local_path(url)
            return sorted(os.listdir(base)) if os.path.isdir(base) else []
        fs, path = self.filesystem(url)
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False, refresh=True))
        except FileNotFoundError:
            return []

    def size(self, url: str) -> int:
        if is_local(url):
            return os.path.getsize(local_path(url))
        fs, path = self.filesystem(url)
        return int(fs.size(path))

    def exists(self, url: str) -> bool:
        if is_local(url):
            return os.path.exists(local_path(url))
        fs, path = self.filesystem(url)
        return bool(fs.exists(path))

    def remove(self, url: str) -> None:
        """Remove a file or a whole directory; nothing if it does not exist."""
        if is_local(url):
            p = local_path(url)
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.remove(p)
            return
        fs, path = self.filesystem(url)
        if fs.exists(path):
            fs.rm(path, recursive=True)

    def open(self, url: str, mode: str = "rb") -> Any:
        """A binary file object; for writing, an object appears whole when it is closed."""
        if is_local(url):
            if "w" in mode:
                os.makedirs(os.path.dirname(local_path(url)) or ".", exist_ok=True)
            return open(local_path(url), mode)
        fs, path = self.filesystem(url)
        return fs.open(path, mode)

    def read_bytes(self, url: str) -> bytes:
        """A whole file in one read. For documents other processes rewrite: an s3fs file object pins
        the ETag it saw at open and fails (``FileExpired``) if the object is replaced meanwhile."""
        if is_local(url):
            with open(local_path(url), "rb") as f:
                return f.read()
        fs, path = self.filesystem(url)
        return bytes(fs.cat_file(path))

    def write_parquet(self, table: Any, url: str, **kwargs: Any) -> int:
        """Write an Arrow table as one Parquet file; returns its size in bytes."""
        import pyarrow.parquet as pq

        if is_local(url):
            self.makedirs(os.path.dirname(local_path(url)))
            pq.write_table(table, local_path(url), **kwargs)
            return os.path.getsize(local_path(url))
        with self.open(url, "wb") as f:
            pq.write_table(table, f, **kwargs)
        return self.size(url)

    def parquet_file(self, url: str) -> Any:
        """A ``pyarrow.parquet.ParquetFile`` of ``url`` (its metadata, row groups, batches)."""
        import pyarrow.parquet as pq

        if is_local(url):
            return pq.ParquetFile(local_path(url))
        return pq.ParquetFile(self.open(url, "rb"))

    def read_parquet(self, url: str, columns: list[str] | None = None) -> Any:
        return self.parquet_file(url).read(columns=columns)

    def probe_write(self, url: str) -> None:
        """Write a small object under the root ``url`` and remove it again: the root is reachable and
        writable with these credentials now. Raises what the file system raised; creates a local root
        (the first run would)."""
        name = f"{str(url).rstrip('/')}/{PROBE_PREFIX}{uuid.uuid4().hex[:12]}"
        if is_local(url):
            os.makedirs(local_path(url), exist_ok=True)
            with open(local_path(name), "wb") as f:
                f.write(b"mysqlcdc")
            os.remove(local_path(name))
            return
        from fsspec.core import url_to_fs

        options = self.fsspec_options(url)
        if protocol(url) in ("s3", "s3a"):
            options["config_kwargs"] = {**_PROBE_S3_CONFIG, **options.get("config_kwargs", {})}
        fs, path = url_to_fs(name, **options)
        with fs.open(path, "wb") as f:
            f.write(b"mysqlcdc")
        fs.rm(path)


def root_problem(storage: LakeStorage, name: str, url: str) -> str | None:
    """Why the root ``name`` (``sink_root``, ``state_root``) at ``url`` cannot be written, with the fix;
    None when a probe object was written and removed (:meth:`LakeStorage.probe_write`)."""
    try:
        storage.probe_write(url)
    except Exception as exc:  # any file-system or client error: the message names it
        error = f"{type(exc).__name__}: {str(exc).strip() or repr(exc)}"
        if is_local(url):
            fix = (f"give {name} a directory this user can create and write on every worker and the Spark driver "
                   "(a shared mount when they are different machines)")  # fmt: skip
        else:
            fix = (f"check that the bucket exists and is reachable, and that the connection named by storage_conn_id "
                   f"(or, without one, the machine's credentials) may write under {url}")  # fmt: skip
        return f"{name} {url!r} is not writable ({error}): nothing was planned. Fix: {fix}"
    return None


LOCAL = LakeStorage()

__all__ = ["LOCAL", "PROBE_PREFIX", "STORAGE_ENV", "LakeStorage", "is_local", "local_path", "protocol", "root_problem"]
