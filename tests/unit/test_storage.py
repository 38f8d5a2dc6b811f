"""LakeStorage: one set of credentials in delta-rs' names, handed to each library in its own form."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_mysqlcdc.storage import STORAGE_ENV, LakeStorage, is_local, local_path, protocol, root_problem

S3 = {
    "aws_access_key_id": "AKIAX",
    "aws_secret_access_key": "very-secret-key",
    "aws_endpoint_url": "http://127.0.0.1:9000",
    "aws_region": "eu-west-1",
    "aws_allow_http": "true",
}


def test_locations() -> None:
    assert is_local("/data/lake") and is_local("file:///data/lake") and not is_local("s3://b/lake")
    assert local_path("file:///data/lake") == "/data/lake" and protocol("S3://b/x") == "s3" and protocol("/x") == "file"


def test_delta_options_make_s3_commits_safe_for_concurrent_writers() -> None:
    opts = LakeStorage(S3).delta_options("s3://bucket/lake")
    assert opts is not None and opts["conditional_put"] == "etag" and opts["aws_secret_access_key"] == "very-secret-key"
    assert LakeStorage({**S3, "conditional_put": "dynamo:locks"}).delta_options("s3://b")["conditional_put"] == (
        "dynamo:locks"
    )  # the user's choice wins
    assert LakeStorage().delta_options("/local/lake") is None
    assert "conditional_put" not in (LakeStorage({"account_name": "a"}).delta_options("abfss://c@a/lake") or {})


def test_fsspec_options_use_s3fs_names() -> None:
    assert LakeStorage(S3).fsspec_options("s3://bucket/x") == {
        "key": "AKIAX",
        "secret": "very-secret-key",
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
        "use_listings_cache": False,
    }
    assert LakeStorage(S3).fsspec_options("/local") == {}
    assert LakeStorage({"token": "t"}).fsspec_options("gs://b/x") == {"token": "t"}


def test_repr_and_transport_never_show_a_value_in_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = LakeStorage(S3)
    assert "very-secret-key" not in repr(storage) and "aws_secret_access_key" in repr(storage)
    monkeypatch.setenv(STORAGE_ENV, storage.to_json())
    assert LakeStorage.from_env() == storage
    monkeypatch.delenv(STORAGE_ENV)
    assert LakeStorage.from_env() == LakeStorage()
    with pytest.raises(ValueError, match=STORAGE_ENV):
        LakeStorage.from_json("[1, 2]")


@pytest.mark.parametrize("root", ["local", "memory"])
def test_file_operations_on_a_local_disk_and_an_fsspec_store(tmp_path: Path, root: str) -> None:
    base = str(tmp_path / "stage") if root == "local" else f"memory://stage-{tmp_path.name}"
    storage = LakeStorage()
    table = pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]})
    size = storage.write_parquet(table, f"{base}/part-1.parquet")
    assert size == storage.size(f"{base}/part-1.parquet") > 0
    assert storage.parquet_file(f"{base}/part-1.parquet").metadata.num_rows == 3
    assert storage.read_parquet(f"{base}/part-1.parquet", columns=["id"]).column("id").to_pylist() == [1, 2, 3]
    with storage.open(f"{base}/part-2.parquet", "wb") as f:
        f.write(b"x")
    assert storage.read_bytes(f"{base}/part-2.parquet") == b"x"
    assert storage.listdir(base) == ["part-1.parquet", "part-2.parquet"]
    storage.remove(f"{base}/part-2.parquet")
    assert storage.listdir(base) == ["part-1.parquet"] and storage.exists(f"{base}/part-1.parquet")
    storage.remove(base)
    assert storage.listdir(base) == [] and storage.listdir(f"{base}/nothing") == []


def test_the_write_probe_of_a_local_root(tmp_path: Path) -> None:
    """The plan's check of sink_root and state_root: a root it can write passes (created if missing,
    nothing left behind); one it cannot fails naming the root, the error and the fix."""
    root = tmp_path / "lake"
    assert root_problem(LakeStorage(), "sink_root", str(root)) is None
    assert root.is_dir() and list(root.iterdir()) == []
    (tmp_path / "a-file").write_text("x")
    for bad in (str(tmp_path / "a-file" / "lake"), "/proc/mysqlcdc-lake"):  # unwritable even for root
        msg = root_problem(LakeStorage(), "sink_root", bad)
        assert msg is not None and msg.startswith(f"sink_root {bad!r} is not writable (")
        assert "Error" in msg and "Fix: give sink_root a directory this user can create and write" in msg
