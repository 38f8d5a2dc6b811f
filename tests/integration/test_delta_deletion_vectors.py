"""Stream batches into big Delta tables with deletion vectors, on real delta-rs (no mocks).

Each test keeps a model of the source (a dict by key) and compares the whole Delta table, read by
delta-rs' own engine (which applies the vectors), with it after every batch.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.sinks import delta_dv_table
from airflow_provider_mysqlcdc.sinks.deletion_vector import vector_location
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_dv_purge import (
    protected_vector_files,
    purge_deletion_vectors,
    vacuum_vector_files,
)
from airflow_provider_mysqlcdc.sinks.delta_log_replay import replay
from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy, maintain_table

TABLE = "shop.events"
APP = "dv-test"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                    pa.field("qty", pa.int32())])  # fmt: skip

Model = dict[int, tuple[str, int]]


def _rows(model: Model, keys: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(keys, pa.int64()), "name": [model[k][0] for k in keys],
                     "qty": pa.array([model[k][1] for k in keys], pa.int32())}, schema=SCHEMA)  # fmt: skip


def _keys(keys: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(keys, pa.int64())})


def _big_table(tmp_path: Path, rows: int = 40_000, files: int = 8, **sink_kw: object) -> tuple[DeltaSink, Model]:
    sink = DeltaSink(str(tmp_path / "lake"), deletion_vectors=True, **sink_kw)  # type: ignore[arg-type]
    sink.prepare_table(TABLE, SCHEMA, ["id"])
    model: Model = {k: (f"n{k}", k % 1000) for k in range(rows)}
    step = rows // files
    for i in range(files):  # one file per key range, as a snapshot writes them
        write_deltalake(sink.table_uri(TABLE), _rows(model, list(range(i * step, (i + 1) * step))), mode="append")
    return sink, model


def _lake(sink: DeltaSink) -> Model:
    t = sink.read(TABLE)
    return {k: (n, q) for k, n, q in zip(*(t.column(c).to_pylist() for c in ("id", "name", "qty")), strict=True)}


def _batch(model: Model, rng: random.Random, size: int, next_key: list[int]) -> tuple[pa.Table, pa.Table]:
    """A folded batch: updates and deletes of random live keys, and inserts of new ones."""
    live = rng.sample(sorted(model), min(size, len(model)))
    ups, dels = [], []
    for k in live:
        if rng.random() < 0.2:
            del model[k]
            dels.append(k)
        else:
            model[k] = (f"u{rng.randrange(10**6)}", rng.randrange(1000))
            ups.append(k)
    for _ in range(size // 5):
        k = next_key[0]
        next_key[0] += 1
        model[k] = (f"i{k}", k % 7)
        ups.append(k)
    return _rows(model, ups), _keys(dels)


def _adds(sink: DeltaSink) -> dict[str, dict]:
    return replay(sink.storage, sink.table_uri(TABLE)).adds


def test_batches_mark_rows_deleted_and_rewrite_only_the_changes(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(delta_dv_table, "SMALL_FILE_ROWS", 1000)  # the 5,000-row base files are not small
    sink, model = _big_table(tmp_path)
    rng, next_key = random.Random(7), [10**6]
    base_files = set(_adds(sink))
    for version in range(1, 13):
        ups, dels = _batch(model, rng, 300, next_key)
        assert sink.apply_changes(TABLE, ups, dels, ["id"], APP, version)
        assert _lake(sink) == model, f"after batch {version}"
        adds = _adds(sink)
        # the snapshot's files stay (with vectors); each batch added one file of its upserts only
        assert base_files <= set(adds)
        new = [a for p, a in adds.items() if p not in base_files]
        assert sum(json.loads(a["stats"])["numRecords"] for a in new) <= version * 360
    dt = DeltaTable(sink.table_uri(TABLE))
    assert "deletionVectors" in (dt.protocol().reader_features or [])
    assert all(a.get("deletionVector") for p, a in _adds(sink).items() if p in base_files)
    # a replayed batch is recognised and skipped; the table is unchanged
    ups, dels = _batch(dict(model), rng, 50, [next_key[0]])
    assert not sink.apply_changes(TABLE, ups, dels, ["id"], APP, 12)
    assert _lake(sink) == model


def test_a_second_process_and_a_checkpoint_read_the_vectors_back(tmp_path: Path) -> None:
    sink, model = _big_table(tmp_path)
    DeltaTable(sink.table_uri(TABLE)).create_checkpoint()  # the first batch reads the table from a checkpoint
    rng, next_key = random.Random(11), [10**6]
    for version in range(1, 6):
        assert sink.apply_changes(TABLE, *_batch(model, rng, 400, next_key), ["id"], APP, version)
    assert DeltaTable(sink.table_uri(TABLE)).metadata().partition_columns == []
    DeltaTable(sink.table_uri(TABLE)).create_checkpoint()
    # a new stream (a restart) indexes the table from the checkpoint and the vectors it names
    again = DeltaSink(sink.root, deletion_vectors=True)
    for version in range(6, 11):
        assert again.apply_changes(TABLE, *_batch(model, rng, 400, next_key), ["id"], APP, version)
        assert _lake(again) == model
    assert not sink.apply_changes(TABLE, *_batch(dict(model), rng, 10, [next_key[0]]), ["id"], APP, 10)
    # the first sink's carried state is stale now: its next batch finds the version taken and reads again
    assert sink.apply_changes(TABLE, *_batch(model, rng, 400, next_key), ["id"], APP, 11)
    assert _lake(sink) == model == _lake(again)


def test_a_merge_by_delta_rs_in_between_is_honoured(tmp_path: Path) -> None:
    """Another writer (here delta-rs' MERGE, as a routed or a blocked path would run) between two
    batches: its commit keeps the vectors, and the stream's next batch starts from it."""
    sink, model = _big_table(tmp_path)
    rng, next_key = random.Random(3), [10**6]
    assert sink.apply_changes(TABLE, *_batch(model, rng, 500, next_key), ["id"], APP, 1)
    plain = DeltaSink(sink.root)  # no deletion vectors, no small-table rewrite: a MERGE
    assert plain.apply_changes(TABLE, *_batch(model, rng, 500, next_key), ["id"], "other-app", 1)
    assert _lake(sink) == model
    assert sink.apply_changes(TABLE, *_batch(model, rng, 500, next_key), ["id"], APP, 2)
    assert _lake(sink) == model


def test_small_files_and_mostly_deleted_files_are_compacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delta_dv_table, "COMPACT_SMALL_FILES", 4)
    monkeypatch.setattr(delta_dv_table, "SMALL_FILE_ROWS", 1000)
    sink, model = _big_table(tmp_path, rows=20_000, files=4)
    rng, next_key = random.Random(5), [10**6]
    for version in range(1, 10):
        assert sink.apply_changes(TABLE, *_batch(model, rng, 200, next_key), ["id"], APP, version)
        assert _lake(sink) == model
        small = [a for a in _adds(sink).values() if json.loads(a["stats"])["numRecords"] < 1000]
        assert len(small) < 4
    # delete most of one base file's keys: the file is rewritten without them
    first = sorted(k for k in model if k < 5_000)
    gone = first[: int(len(first) * 0.8)]
    for k in gone:
        del model[k]
    assert sink.apply_changes(TABLE, _rows(model, []), _keys(gone), ["id"], APP, 10)
    assert _lake(sink) == model
    assert all(len((a.get("deletionVector") and [1]) or []) == 0 or a["deletionVector"]["cardinality"]
               <= 0.5 * json.loads(a["stats"])["numRecords"] for a in _adds(sink).values())  # fmt: skip


def _wait_seen(seen: list[tuple[int, int, int]], version: int, timeout: float = 30.0) -> None:
    """Until the reader has read ``version`` (or ``timeout`` passed: the assertions then say so)."""
    deadline = time.monotonic() + timeout
    while not any(v >= version for v, _, _ in list(seen)) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_readers_see_each_batch_whole(tmp_path: Path) -> None:
    """Every batch moves quantity between two rows (the total stays the same) and replaces a row by
    a new key; a reader polling every version must see the same total and row count each time."""
    sink, model = _big_table(tmp_path, rows=20_000, files=4)
    total, count = sum(q for _, q in model.values()), len(model)
    stop = threading.Event()
    seen: list[tuple[int, int, int]] = []
    errors: list[str] = []

    def reader() -> None:
        uri = sink.table_uri(TABLE)
        last = -1
        while not stop.is_set() or last < DeltaTable(uri).version():
            dt = DeltaTable(uri)
            if dt.version() == last:
                continue
            last = dt.version()
            sql = "SELECT count(*) AS n, sum(qty) AS s, count(DISTINCT id) AS d FROM t"
            got = pa.table(QueryBuilder().register("t", dt).execute(sql).read_all())
            n, s, d = (got.column(c)[0].as_py() for c in ("n", "s", "d"))
            seen.append((last, n, s))
            if n != count or s != total or d != n:
                errors.append(f"version {last}: {n} rows, {d} keys, total {s}")

    t = threading.Thread(target=reader)
    t.start()
    rng, next_key = random.Random(9), [10**6]
    try:
        for version in range(1, 31):
            a, b = rng.sample(sorted(model), 2)
            moved = min(model[a][1], 5)
            model[a] = (model[a][0], model[a][1] - moved)
            model[b] = (model[b][0], model[b][1] + moved)
            old = rng.choice(sorted(model))
            new = next_key[0]
            next_key[0] += 1
            model[new] = model.pop(old)
            ups = _rows(model, sorted({a, b, new}))
            assert sink.apply_changes(TABLE, ups, _keys([old]), ["id"], APP, version)
            if version % 6 == 0:  # let the reader catch up now and then: a loaded host can starve it
                _wait_seen(seen, DeltaTable(sink.table_uri(TABLE)).version())
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors[:5]
    assert len({v for v, _, _ in seen}) >= 5
    assert _lake(sink) == model


def test_purge_then_a_foreign_rewrite_keeps_every_row(tmp_path: Path) -> None:
    """Paths that remove files by path alone (a repair's swap, a re-snapshot) purge the vectors
    first: afterwards no file carries one, and the table's rows are unchanged."""
    sink, model = _big_table(tmp_path)
    rng, next_key = random.Random(13), [10**6]
    for version in range(1, 4):
        assert sink.apply_changes(TABLE, *_batch(model, rng, 500, next_key), ["id"], APP, version)
    assert purge_deletion_vectors(sink, TABLE) > 0
    assert not any(a.get("deletionVector") for a in _adds(sink).values())
    assert _lake(sink) == model
    assert purge_deletion_vectors(sink, TABLE) == 0
    # the stream carries on after the purge (its state is stale: it reads the table again)
    assert sink.apply_changes(TABLE, *_batch(model, rng, 500, next_key), ["id"], APP, 4)
    assert _lake(sink) == model


def test_vacuum_keeps_live_vector_files_and_removes_superseded_ones(tmp_path: Path) -> None:
    sink, model = _big_table(tmp_path)
    rng, next_key = random.Random(17), [10**6]
    for version in range(1, 6):
        assert sink.apply_changes(TABLE, *_batch(model, rng, 300, next_key), ["id"], APP, version)
    root = sink.table_uri(TABLE)
    before = {n for n in os.listdir(root) if n.startswith("deletion_vector_")}
    assert len(before) == 5
    live = protected_vector_files(sink, TABLE)
    with open(f"{root}/_delta_log/{DeltaTable(root).version():020d}.json") as f:
        last = [json.loads(line) for line in f]
    # the version before the last one stays readable (as the data files' vacuum keeps it)
    superseded = {vector_location(dv) for a in last if (dv := a.get("remove", {}).get("deletionVector"))}
    removed = vacuum_vector_files(sink, TABLE, retention_seconds=0)
    after = {n for n in os.listdir(root) if n.startswith("deletion_vector_")}
    assert after == before & (live | superseded) and set(removed) == before - after
    assert len(live) == 1 and removed
    assert _lake(sink) == model
    # a vacuum within the retention deletes nothing
    assert vacuum_vector_files(sink, TABLE, retention_seconds=3600) == []


def test_tables_the_layout_does_not_serve_keep_the_merge(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "lake"), deletion_vectors=True)
    schema = pa.schema([pa.field("code", pa.string(), nullable=False), pa.field("qty", pa.int32())])
    sink.prepare_table("shop.codes", schema, ["code"])
    write_deltalake(sink.table_uri("shop.codes"), pa.table({"code": ["a", "b"], "qty": pa.array([1, 2], pa.int32())}),
                    mode="append")  # fmt: skip
    ups = pa.table({"code": ["a"], "qty": pa.array([5], pa.int32())})
    assert sink.apply_changes("shop.codes", ups, pa.table({"code": pa.array([], pa.string())}), ["code"], APP, 1)
    assert "not an integer" in sink.dv_blocked[sink.table_uri("shop.codes")]
    assert "deletionVectors" not in (DeltaTable(sink.table_uri("shop.codes")).protocol().reader_features or [])
    assert sorted(sink.read("shop.codes").column("qty").to_pylist()) == [2, 5]


def test_a_snapshot_group_commit_purges_the_vectors_first(tmp_path: Path) -> None:
    """A group commit (a backfill) removes files by path: it purges the vectors first, so the rows
    they hide stay hidden and nothing is duplicated."""
    sink, model = _big_table(tmp_path)
    rng, next_key = random.Random(19), [10**6]
    for version in range(1, 4):
        assert sink.apply_changes(TABLE, *_batch(model, rng, 500, next_key), ["id"], APP, version)
    extra = {k: (f"g{k}", 1) for k in range(5 * 10**6, 5 * 10**6 + 100)}
    staged = f"{sink.staging_location(TABLE, 'g1', 'a1')}/part-0.parquet"
    os.makedirs(os.path.dirname(staged), exist_ok=True)
    pq.write_table(_rows(extra, sorted(extra)), staged)
    sink.commit_snapshot_group(TABLE, "g1", [StagedFile(staged, 100, os.path.getsize(staged))], SCHEMA, {})
    model.update(extra)
    assert _lake(sink) == model
    assert not any(a.get("deletionVector") for a in _adds(sink).values())
    assert sink.apply_changes(TABLE, *_batch(model, rng, 500, next_key), ["id"], APP, 4)
    assert _lake(sink) == model


def test_maintenance_keeps_live_vectors_through_a_full_vacuum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delta_dv_table, "COMPACT_SMALL_FILES", 3)  # compactions remove files too
    sink, model = _big_table(tmp_path)
    rng, next_key = random.Random(23), [10**6]
    at: dict[int, Model] = {}
    for version in range(1, 6):
        assert sink.apply_changes(TABLE, *_batch(model, rng, 300, next_key), ["id"], APP, version)
        at[DeltaTable(sink.table_uri(TABLE)).version()] = dict(model)
    # within the retention, every version stays readable after a full vacuum (orphans), whatever
    # the files' ages: files written two hours ago, removed within the last hour, stay
    old = time.time() - 7200
    for d, _, names in os.walk(sink.table_uri(TABLE)):
        for n in names:
            if not d.endswith("_delta_log"):
                os.utime(os.path.join(d, n), (old, old))
    kept = maintain_table(sink, TABLE, MaintenancePolicy(retention_hours=1, log_retention_hours=1), orphans=True)
    assert kept.vacuumed_files == 0
    for v, then in at.items():
        got = pa.table(QueryBuilder().register("t", DeltaTable(sink.table_uri(TABLE), version=v))
                       .execute("SELECT id, name, qty FROM t").read_all())  # fmt: skip
        assert dict(zip(got.column("id").to_pylist(), zip(got.column("name").to_pylist(),
                                                          got.column("qty").to_pylist(), strict=True),
                        strict=True)) == then, f"version {v}"  # fmt: skip
    result = maintain_table(sink, TABLE, MaintenancePolicy(retention_hours=0, log_retention_hours=0), orphans=True)
    assert result.compacted_files == 0  # the stream compacts a table with vectors itself
    assert result.vacuumed_files > 0  # superseded vector files (and nothing live)
    assert protected_vector_files(sink, TABLE)
    assert all(os.path.exists(f"{sink.table_uri(TABLE)}/{p}") for p in protected_vector_files(sink, TABLE))
    assert _lake(DeltaSink(sink.root)) == model
    assert sink.apply_changes(TABLE, *_batch(model, rng, 300, next_key), ["id"], APP, 6)
    assert _lake(sink) == model


def test_commits_changing_no_file_are_caught_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Maintenance setting a property between two batches: the stream applies that entry to its
    state instead of reading every file's keys again."""
    sink, model = _big_table(tmp_path)
    rng, next_key = random.Random(29), [10**6]
    assert sink.apply_changes(TABLE, *_batch(model, rng, 300, next_key), ["id"], APP, 1)
    loads: list[str] = []
    load_state = delta_dv_table.load_state
    monkeypatch.setattr(delta_dv_table, "load_state", lambda *a, **kw: loads.append(a[1]) or load_state(*a, **kw))
    DeltaTable(sink.table_uri(TABLE)).alter.set_table_properties({"delta.logRetentionDuration": "interval 2 days"})
    assert sink.apply_changes(TABLE, *_batch(model, rng, 300, next_key), ["id"], APP, 2)
    assert loads == []  # caught up, not indexed again
    assert _lake(sink) == model
    conf = DeltaTable(sink.table_uri(TABLE)).metadata().configuration
    assert conf["delta.logRetentionDuration"] == "interval 2 days" and conf["delta.enableDeletionVectors"] == "true"
    # a commit that changes files is not caught up: the index is read again
    plain = DeltaSink(sink.root)
    assert plain.apply_changes(TABLE, *_batch(model, rng, 50, next_key), ["id"], "other-app", 1)
    assert sink.apply_changes(TABLE, *_batch(model, rng, 300, next_key), ["id"], APP, 3)
    assert loads == [TABLE]
    assert _lake(sink) == model
