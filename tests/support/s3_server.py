"""A private S3-compatible server for tests: moto's standalone server on 127.0.0.1.

``S3Server`` starts ``python -m moto.server`` as a child process in its own process group, on a
free port, logging to a file in its own temporary directory; it waits until the server answers,
then creates one bucket. What a client needs to reach it is an ``S3Endpoint`` (plain, picklable
data, so it can travel into Spark tasks), with helpers for delta-rs (``storage_options()``),
fsspec (``fsspec()``) and ``s3://`` URLs (``url()``).

The secret key is random and long on purpose: the secret-scan tests (``tests/support/secret_scan``)
look for it in process argv, Spark's environment page and log files, and a short or fixed value
would match by accident.

Verified with moto 5.2.5: PutObject honours ``If-None-Match: *`` (412 when the key exists), so
delta-rs with ``conditional_put=etag`` commits concurrent writers safely (no lost version).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.mariadb import free_port

log = logging.getLogger(__name__)

REGION = "us-east-1"


@dataclass(frozen=True)
class S3Endpoint:
    """How to reach one bucket on the test server: plain data, safe to pickle into Spark tasks."""

    endpoint_url: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    region: str = REGION

    def url(self, path: str = "") -> str:
        """``s3://<bucket>/<path>``."""
        return f"s3://{self.bucket}/{path.lstrip('/')}"

    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options``: plain HTTP, and conditional PUT so concurrent commits are safe."""
        return {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_endpoint_url": self.endpoint_url,
            "aws_region": self.region,
            "aws_allow_http": "true",
            "conditional_put": "etag",
        }

    def fsspec(self) -> Any:
        """An ``s3fs.S3FileSystem`` on the server (a fresh instance: s3fs caches by arguments)."""
        import s3fs

        return s3fs.S3FileSystem(
            key=self.access_key_id,
            secret=self.secret_access_key,
            endpoint_url=self.endpoint_url,
            client_kwargs={"region_name": self.region},
            skip_instance_cache=True,
        )

    def boto3_client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
        )

    def as_dict(self) -> dict[str, str]:
        return {
            "endpoint_url": self.endpoint_url,
            "bucket": self.bucket,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "region": self.region,
        }


class S3Server:
    """Start/stop moto's S3 server on 127.0.0.1 and create a bucket on it."""

    def __init__(self, bucket: str = "lake", basedir: str | os.PathLike[str] | None = None) -> None:
        self._own_basedir = basedir is None
        self.basedir = Path(basedir or tempfile.mkdtemp(prefix="mysqlcdc-s3-"))
        self.log_path = self.basedir / "moto.log"
        self.port = free_port()
        self.bucket = bucket
        self.endpoint = S3Endpoint(
            endpoint_url=f"http://127.0.0.1:{self.port}",
            bucket=bucket,
            access_key_id="AKIA" + secrets.token_hex(8).upper(),
            secret_access_key="s3secret-" + secrets.token_urlsafe(32),
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    # convenience: the endpoint's fields and helpers on the server itself
    @property
    def endpoint_url(self) -> str:
        return self.endpoint.endpoint_url

    @property
    def access_key_id(self) -> str:
        return self.endpoint.access_key_id

    @property
    def secret_access_key(self) -> str:
        return self.endpoint.secret_access_key

    @property
    def region(self) -> str:
        return self.endpoint.region

    def url(self, path: str = "") -> str:
        return self.endpoint.url(path)

    def storage_options(self) -> dict[str, str]:
        return self.endpoint.storage_options()

    def fsspec(self) -> Any:
        return self.endpoint.fsspec()

    # ---------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 30.0) -> S3Server:
        t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: stop() kills whatever it spawned
            )
        self._wait_ready(timeout)
        self.endpoint.boto3_client().create_bucket(Bucket=self.bucket)
        self.startup_seconds = time.monotonic() - t0
        log.info("moto S3 server up on %s in %.1f s (log %s)", self.endpoint_url, self.startup_seconds, self.log_path)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                # moto's management endpoint; any HTTP answer means the server is serving
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/data.json", timeout=2):
                    return
            except urllib.error.HTTPError:
                return
            except (OSError, urllib.error.URLError) as exc:
                last = exc
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server not answering on {self.endpoint_url} after {timeout:.0f} s: {last}; "
                           f"log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server, then SIGKILL its whole process group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)

    def destroy(self) -> None:
        self.stop()
        if self._own_basedir:
            shutil.rmtree(self.basedir, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
