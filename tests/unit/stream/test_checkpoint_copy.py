"""The stream checkpoint's local copy for an object-store state store (an fsspec memory store here)."""

from __future__ import annotations

import os
import uuid

from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.checkpoint_copy import CheckpointCopy


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_new_files_reach_the_store_and_a_new_driver_restores_them() -> None:
    store = StateStore(f"memory://state-{uuid.uuid4().hex}", "p")
    first = CheckpointCopy(store, "checkpoint")
    assert first.restore() == 0
    _write(f"{first.local}/metadata", '{"id":"q"}')
    _write(f"{first.local}/offsets/0", "v1\n{}\n{\"file\":\"b.1\",\"pos\":4}")
    _write(f"{first.local}/offsets/.0.crc", "crc")  # Hadoop's checksum: not part of the checkpoint
    _write(f"{first.local}/commits/.1.tmp", "partial")  # a temporary file Spark renames later
    assert first.push() == 2
    assert first.push() == 0  # nothing new
    _write(f"{first.local}/commits/0", "v1\n{}")
    _write(f"{first.local}/offsets/1", "v1\n{}\n{\"file\":\"b.1\",\"pos\":9}")
    assert first.push() == 2
    assert store.list("checkpoint/offsets") == ["0", "1"] and store.list("checkpoint/commits") == ["0"]
    first.close()
    assert not os.path.exists(first.local)

    second = CheckpointCopy(store, "checkpoint")  # another machine
    assert second.restore() == 4
    with open(f"{second.local}/offsets/1") as f:
        assert f.read().endswith('"pos":9}')
    assert second.push() == 0  # restored files are not copied back
    second.close()
