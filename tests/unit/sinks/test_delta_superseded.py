"""Superseded small-table files (sinks/delta_superseded.py): kept for their grace, then deleted —
never one the table holds again — and what is still within its grace is what the whole-table
rewrite's budget counts. A fake clock: nothing here waits."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.sinks.delta_superseded import SupersededFiles
from airflow_provider_mysqlcdc.storage import LOCAL


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _files(root: Path, *names: str) -> dict[str, int]:
    for n in names:
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_bytes(b"x" * 10)
    return dict.fromkeys(names, 10)


def test_files_go_once_their_grace_has_passed_and_never_a_live_one(tmp_path: Path) -> None:
    clock = _Clock()
    queue = SupersededFiles(60, clock)
    uri = str(tmp_path)
    queue.add("t", uri, _files(tmp_path, "stream/a.parquet", "stream/b.parquet"), data=True)
    queue.add("t", uri, _files(tmp_path, "deletion_vector_1.bin"), data=False)
    assert queue.pending_data_bytes("t") == 20  # vector files are not counted
    assert queue.due_keys() == {} and queue.sweep(LOCAL, "t", set()) == 0
    assert (tmp_path / "stream/a.parquet").exists()  # a reader of the older version may still read it
    clock.t += 59.9
    assert queue.sweep(LOCAL, "t", set()) == 0 and queue.pending_data_bytes("t") == 20
    clock.t += 0.2
    assert queue.pending_data_bytes("t") == 0 and queue.due_keys() == {"t": uri}
    # b is live again (a table restored to an older version): dropped from the queue, kept on disk
    assert queue.sweep(LOCAL, "t", {"stream/b.parquet"}) == 2
    assert not (tmp_path / "stream/a.parquet").exists() and not (tmp_path / "deletion_vector_1.bin").exists()
    assert (tmp_path / "stream/b.parquet").exists()
    assert queue.waiting == 0 and queue.deleted_files == 2 and queue.deleted_bytes == 20


def test_keys_are_kept_apart_and_later_files_wait_for_their_own_grace(tmp_path: Path) -> None:
    clock = _Clock()
    queue = SupersededFiles(10, clock)
    queue.add("t@db_a.o", str(tmp_path), _files(tmp_path, "a1"), data=True)
    clock.t += 5
    queue.add("t@db_a.o", str(tmp_path), _files(tmp_path, "a2"), data=True)
    queue.add("t@db_b.o", str(tmp_path), _files(tmp_path, "b1"), data=True)
    clock.t += 6
    assert queue.due_keys() == {"t@db_a.o": str(tmp_path)}
    assert queue.sweep(LOCAL, "t@db_a.o", set()) == 1
    assert queue.pending_data_bytes("t@db_a.o") == 10 and (tmp_path / "a2").exists() and (tmp_path / "b1").exists()
    queue.forget("t@db_b.o")
    assert queue.pending_data_bytes("t@db_b.o") == 0 and queue.waiting == 1


def test_a_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        SupersededFiles(0)


def test_a_whole_rewrite_is_held_for_one_grace() -> None:
    clock = _Clock()
    queue = SupersededFiles(60, clock)
    assert not queue.rewrite_held("t")  # never rewritten (or a stream just started): rewrite whole
    queue.rewrote("t")
    clock.t += 59
    assert queue.rewrite_held("t") and not queue.rewrite_held("u")
    clock.t += 1
    assert not queue.rewrite_held("t")
