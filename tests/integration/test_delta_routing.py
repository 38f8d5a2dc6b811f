"""A routed table's shards sharing one Delta table, with real delta-rs (docs/architecture.md,
"Routing sharded tables"): every write of a shard stays in its partition, and each shard records
its own batch ids, so a batch that crashed after some shards committed replays only the others."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.routing import Routes
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink, UnsupportedSchemaChange
from airflow_provider_mysqlcdc.sinks.delta_fill import fill_columns
from airflow_provider_mysqlcdc.sinks.delta_merge import replace_rows

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
ROUTES = Routes.from_list([{"source": "db_?.orders", "target": "shop.orders"}])
A, B = "db_a.orders", "db_b.orders"


def _rows(sink: DeltaSink) -> list[tuple[str, int, str | None]]:
    dt = DeltaTable(f"{sink.root}/shop/orders")
    t = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    return sorted(zip(t["_source_database"].to_pylist(), t["id"].to_pylist(), t["v"].to_pylist(), strict=True))


def _snapshot(sink: DeltaSink, table: str, ids: range, group: str = "p1-g00000") -> None:
    sink.prepare_table(table, SCHEMA, ["id"])
    staging = sink.staging_location(table, group, "a1")
    path = f"{staging}/part-0.parquet"
    os.makedirs(staging, exist_ok=True)
    pq.write_table(pa.table({"id": list(ids), "v": [f"{table}-{i}" for i in ids]}, schema=SCHEMA), path)
    sink.commit_snapshot_group(table, group, [StagedFile(path, len(ids), os.path.getsize(path))], SCHEMA, {})


def _sink(tmp_path: object, path: str) -> DeltaSink:
    """``path``: "merge", "small-table-rewrite" (every batch rewrites the shard whole), or
    "small-table-marks" (after its first rewrite, a shard's batches mark rows with deletion vectors:
    the rewritten copy is within its grace, an hour here)."""
    return DeltaSink(str(tmp_path), owner="p", routes=ROUTES, rewrite_below_bytes=0 if path == "merge" else 1 << 30,
                     deletion_vectors=path == "small-table-marks",
                     small_table_retention_seconds=3600 if path == "small-table-marks" else None)  # fmt: skip


SHARD_PATHS = pytest.mark.parametrize("path", ["merge", "small-table-rewrite", "small-table-marks"])


@SHARD_PATHS
def test_shards_share_one_table_and_replay_per_shard(tmp_path: object, path: str) -> None:
    sink = _sink(tmp_path, path)
    _snapshot(sink, A, range(1, 4))
    _snapshot(sink, B, range(1, 4))  # the same group commits both shards: each keeps its own files
    assert [r[:2] for r in _rows(sink)] == [(d, i) for d in ("db_a", "db_b") for i in (1, 2, 3)]
    assert sink.read(A).schema.names == ["id", "v"] and sink.read(A).num_rows == 3

    up = pa.table({"id": [2, 9], "v": ["a2", "a9"]}, schema=SCHEMA)
    assert sink.apply_changes(A, up, pa.table({"id": [3]}), ["id"], "app", 5)
    # batch 5 of shard A is recorded under A's app id only: B's part of the same batch still applies
    assert not sink.apply_changes(A, up, pa.table({"id": [3]}), ["id"], "app", 5)
    assert sink.apply_changes(B, pa.table({"id": [2], "v": ["b2"]}, schema=SCHEMA), pa.table({"id": [1]}), ["id"],
                              "app", 5)  # fmt: skip
    assert _rows(sink) == [("db_a", 1, "db_a.orders-1"), ("db_a", 2, "a2"), ("db_a", 9, "a9"),
                           ("db_b", 2, "b2"), ("db_b", 3, "db_b.orders-3")]  # fmt: skip

    # a TRUNCATE (evolve) of shard B replaces its rows only
    assert replace_rows(sink, B, pa.table({"id": [7], "v": ["b7"]}, schema=SCHEMA), "app", 6)
    assert [r for r in _rows(sink) if r[0] == "db_b"] == [("db_b", 7, "b7")]
    assert len([r for r in _rows(sink) if r[0] == "db_a"]) == 3

    # a re-snapshot of shard A is swapped into its partition; B's rows stay
    _snapshot(sink, A, range(100, 102), group="p2-g00000")
    files = sink.table_files(A)
    assert all("p2-g00000" in p or "snapshot" not in p for p in files)
    staged = [StagedFile(f"{sink.table_uri(A)}/{p}", 2, s) for p, s in files.items() if "p2-g00000" in p]
    sink.replace_with_files(A, staged, SCHEMA, {})
    assert [r[:2] for r in _rows(sink)] == [("db_a", 100), ("db_a", 101), ("db_b", 7)]


@SHARD_PATHS
def test_one_shard_adds_a_column_the_others_read_null(tmp_path: object, path: str) -> None:
    sink = _sink(tmp_path, path)
    _snapshot(sink, A, range(1, 3))
    _snapshot(sink, B, range(1, 3))
    wider = pa.schema([*SCHEMA, ("channel", pa.string())])
    sink.evolve_schema(A, wider, ["id"])
    sink.apply_changes(A, pa.table({"id": [1], "v": ["x"], "channel": ["web"]}, schema=wider), pa.table({"id": []}),
                       ["id"], "app", 1)  # fmt: skip
    sink.apply_changes(B, pa.table({"id": [1], "v": ["y"]}, schema=SCHEMA), pa.table({"id": []}), ["id"], "app", 1)
    rows = sink.read(B).to_pylist()
    assert {r["id"]: r["channel"] for r in rows} == {1: None, 2: None}
    assert {r["id"]: r["channel"] for r in sink.read(A).to_pylist()} == {1: "web", 2: None}
    # the ADD COLUMN's default for A's existing rows: written in A's partition only, in one commit
    version = DeltaTable(sink.table_uri(A)).version()
    assert fill_columns(sink, A, {"channel": "old"}) == 2
    assert DeltaTable(sink.table_uri(A)).version() == version + 1
    assert {r["id"]: r["channel"] for r in sink.read(A).to_pylist()} == {1: "old", 2: "old"}
    assert {r["id"]: r["channel"] for r in sink.read(B).to_pylist()} == {1: None, 2: None}
    assert [r["v"] for r in sink.read(B).to_pylist()] == ["y", "db_b.orders-2"]
    with pytest.raises(UnsupportedSchemaChange, match="follows only ADD COLUMN"):
        sink.evolve_schema(B, pa.schema([("id", pa.int64()), ("v", pa.large_string()), ("n", pa.int32())]), ["id"],
                           drop_columns=["channel"])  # fmt: skip
    with pytest.raises(UnsupportedSchemaChange, match="do not fit"):  # a shard whose column type differs
        sink.prepare_table("db_c.orders", pa.schema([("id", pa.int64()), ("v", pa.int32())]), ["id"])
    # a shard with a column the others lack widens the shared table; a re-snapshot never replaces it
    sink.prepare_table("db_d.orders", pa.schema([*wider, ("region", pa.string())]), ["id"])
    assert "region" in sink.read(A).schema.names and sink.read(A).column("region").null_count == 2
    _snapshot(sink, B, range(5, 6), group="p3-g00000")
    staged = [StagedFile(f"{sink.table_uri(B)}/{p}", 1, s) for p, s in sink.table_files(B).items() if "p3-" in p]
    sink.replace_with_files(B, staged, SCHEMA, {})
    assert [r["id"] for r in sink.read(B).to_pylist()] == [5] and sink.read(A).num_rows == 2


class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@SHARD_PATHS
def test_random_batches_over_shards_match_the_model(tmp_path: object, path: str) -> None:
    """Three shards take batch after batch, one after the other as the stream applies them (each
    shard's commit follows its siblings'); the shared table holds exactly each shard's rows. With
    marks, a shard is rewritten whole once per grace and marks rows in between, and what its commits
    superseded is deleted once the grace has passed."""
    import random

    shards = [A, B, "db_c.orders"]
    sink = _sink(tmp_path, path)
    clock = _Clock()
    if sink.superseded is not None:
        sink.superseded.retention_seconds, sink.superseded.clock = 5.0, clock
    models: dict[str, dict[int, str]] = {}
    for s in shards:
        _snapshot(sink, s, range(1, 60))
        models[s] = {i: f"{s}-{i}" for i in range(1, 60)}
    rng = random.Random(21)
    for version in range(1, 25):
        clock.t += 1
        for s in shards:
            if rng.random() < 0.2:
                continue  # a shard without changes in this batch
            up: dict[int, str] = {}
            gone: set[int] = set()
            for _ in range(rng.randrange(1, 12)):
                k = rng.randrange(1, 80)
                if k in models[s] and rng.random() < 0.3:
                    gone.add(k)
                    up.pop(k, None)
                else:
                    up[k] = f"{s}-{k}-{version}"
                    gone.discard(k)
            ids = sorted(up)
            assert sink.apply_changes(s, pa.table({"id": ids, "v": [up[i] for i in ids]}, schema=SCHEMA),
                                      pa.table({"id": pa.array(sorted(gone), pa.int64())}), ["id"], "app", version)
            for k in gone:
                models[s].pop(k, None)
            models[s].update(up)
            # the same batch again (a replay after a crash) is skipped by this shard's own batch id
            assert not sink.apply_changes(s, pa.table({"id": [1], "v": ["x"]}, schema=SCHEMA),
                                          pa.table({"id": pa.array([], pa.int64())}), ["id"], "app", version)
        want = sorted((s.split(".")[0], k, v) for s in shards for k, v in models[s].items())
        assert _rows(sink) == want, f"the shared table differs from the shards after batch {version}"
    for s in shards:
        assert {r["id"]: r["v"] for r in sink.read(s).to_pylist()} == models[s]
    if path == "small-table-marks":
        entries = _commit_details(sink)
        assert {True, False} <= {e["small_table_rewrite"] for e in entries}, "both ways were taken"
        clock.t += 6
        from airflow_provider_mysqlcdc.sinks.delta_small_table import sweep_superseded

        sweep_superseded(sink)  # every superseded file is past its grace: only the live ones stay
        live = set(sink.table_files(A)) | set(sink.table_files(B)) | set(sink.table_files("db_c.orders"))
        root = os.path.join(str(tmp_path), "shop", "orders")
        on_disk = {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
                   if f.endswith(".parquet") and "_delta_log" not in d}  # fmt: skip
        assert on_disk == live


def _commit_details(sink: DeltaSink) -> list[dict]:
    import json

    out = []
    log_dir = os.path.join(sink.root, "shop", "orders", "_delta_log")
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".json"):
            with open(os.path.join(log_dir, name)) as f:
                info = json.loads(f.readline())["commitInfo"]
            details = json.loads(info.get("mysqlcdc") or "{}")
            if "small_table_rewrite" in details:  # a stream batch's (not a snapshot group's)
                out.append(details)
    return out
