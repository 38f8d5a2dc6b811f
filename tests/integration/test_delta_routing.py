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


@pytest.mark.parametrize("rewrite_below", [0, 1 << 30], ids=["merge", "small-table-rewrite"])
def test_shards_share_one_table_and_replay_per_shard(tmp_path: object, rewrite_below: int) -> None:
    sink = DeltaSink(str(tmp_path), owner="p", routes=ROUTES, rewrite_below_bytes=rewrite_below)
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


@pytest.mark.parametrize("rewrite_below", [0, 1 << 30], ids=["merge", "small-table-rewrite"])
def test_one_shard_adds_a_column_the_others_read_null(tmp_path: object, rewrite_below: int) -> None:
    sink = DeltaSink(str(tmp_path), owner="p", routes=ROUTES, rewrite_below_bytes=rewrite_below)
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
