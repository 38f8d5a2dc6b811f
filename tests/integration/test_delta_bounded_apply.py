"""The bounded-memory apply (``sinks/delta_rewrite.py``) leaves a Delta table exactly as the MERGE does.

Real delta-rs tables on temporary directories. The same random batches (inserts, updates, deletes,
key moves, keys that do not exist) go through ``DeltaSink.apply_changes`` (one MERGE) on one copy
and through ``BucketedFold`` + ``apply_folded_changes`` on another, with several bucket counts and
budgets small enough that the changed keys spill to scratch files and are matched in several
passes; both tables must hold the same rows, and the bounded apply must be one commit carrying the
batch id, skipped when replayed.
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_mysqlcdc.core.change_block import BlockBuilder, block_schema, fold_block
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.row_metadata import lake_schema, with_snapshot_metadata
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_rewrite import apply_folded_changes
from airflow_provider_mysqlcdc.spill.bucketed_fold import BucketedFold

APP = "mysqlcdc-stream-bounded"


def _schema(composite: bool) -> tuple[pa.Schema, list[str]]:
    if composite:
        return pa.schema([pa.field("k", pa.string(), False), pa.field("n", pa.int32(), False),
                          pa.field("v", pa.int64()), pa.field("s", pa.string())]), ["k", "n"]  # fmt: skip
    return pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.int64()), pa.field("s", pa.string())]), ["id"]


def _key(i: int, composite: bool) -> dict[str, Any]:
    return {"k": f"g{i % 7}", "n": i} if composite else {"id": i}


def _snapshot(sink: DeltaSink, table: str, schema: pa.Schema, pk: list[str], rows: list[dict[str, Any]],
              files: int, tmp: Any) -> None:  # fmt: skip
    """Seed the table as the snapshot does: several staged Parquet files adopted in one commit."""
    import pyarrow.parquet as pq

    sink.prepare_table(table, schema, pk)
    staged = []
    per = max(1, len(rows) // files)
    for i in range(0, len(rows), per):
        path = f"{sink.table_uri(table)}/snapshot/g/part-{i:06d}.parquet"
        import os

        os.makedirs(os.path.dirname(path), exist_ok=True)
        part = pa.Table.from_pylist(rows[i : i + per], schema=schema)
        pq.write_table(part, path)
        staged.append(StagedFile(path, part.num_rows, os.path.getsize(path)))
    sink.commit_snapshot_group(table, "g", staged, schema, {})


def _read(sink: DeltaSink, table: str, pk: list[str]) -> list[dict[str, Any]]:
    return sorted(sink.read(table).to_pylist(), key=lambda r: tuple(r[c] for c in pk))


def _batch(rng: random.Random, schema: pa.Schema, pk: list[str], n_rows: int, composite: bool,
           changes: int) -> pa.Table:  # fmt: skip
    b = BlockBuilder(block_schema(schema, pk))
    live = set(range(n_rows))
    out = []
    for seq in range(changes):
        r = rng.random()
        k = rng.randrange(0, n_rows * 2)
        row = {**_key(k, composite), "v": seq, "s": f"s{seq}" * rng.randrange(0, 4)}
        if k not in live:
            b.add("c", "f.000001", 4 + seq, 1, seq, 0, seq, seq, None, row)
            live.add(k)
        elif r < 0.5:
            b.add("u", "f.000001", 4 + seq, 1, seq, 0, seq, seq, _key(k, composite), row)
        elif r < 0.7:  # key move
            k2 = rng.randrange(n_rows * 2, n_rows * 3)
            if k2 in live:
                continue
            b.add("u", "f.000001", 4 + seq, 1, seq, 0, seq, seq, _key(k, composite), {**row, **_key(k2, composite)})
            live.discard(k)
            live.add(k2)
        else:
            b.add("d", "f.000001", 4 + seq, 1, seq, 0, seq, seq, _key(k, composite), None)
            live.discard(k)
        if len(b) >= 700:
            out.append(b.build())
    if len(b):
        out.append(b.build())
    return pa.Table.from_batches(out)


@pytest.mark.parametrize(("composite", "buckets", "memory"), [
    (False, 1, 64 << 20),  # everything in memory, one pass
    (False, 5, 4096),  # keys spill, matched in many passes
    (True, 3, 64 << 20),
    (True, 4, 8192),
])  # fmt: skip
def test_bounded_apply_equals_merge(tmp_path, composite: bool, buckets: int, memory: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(buckets * 31 + memory)
    schema, pk = _schema(composite)
    n = 3000
    seed_rows = [{**_key(i, composite), "v": -i, "s": "seed"} for i in range(n)]
    merge_sink, bounded_sink = DeltaSink(str(tmp_path / "merge")), DeltaSink(str(tmp_path / "bounded"))
    for s in (merge_sink, bounded_sink):
        _snapshot(s, "d.t", schema, pk, seed_rows, files=6, tmp=tmp_path)
    for version in range(3):
        data = _batch(rng, schema, pk, n, composite, changes=2500)
        up, dels = fold_block(data.sort_by("seq"), pk)
        merge_sink.apply_changes("d.t", up, dels, pk, APP, version)
        fold = BucketedFold(pk, buckets, str(tmp_path / "scratch" / f"fold-{version}"))
        fold.add(data)
        before = DeltaTable(bounded_sink.table_uri("d.t")).version()
        scratch = str(tmp_path / "scratch" / f"keys-{version}")
        res = apply_folded_changes(bounded_sink, "d.t", fold.buckets(), pk, APP, version, workdir=scratch,
                                   memory_bytes=memory)  # fmt: skip
        fold.close()
        assert res.applied and res.version == before + 1  # one commit for the whole batch
        if memory < 10_000:
            assert res.key_passes > 1
        assert _read(bounded_sink, "d.t", pk) == _read(merge_sink, "d.t", pk)
        assert DeltaTable(bounded_sink.table_uri("d.t")).transaction_version(APP) == version
    # a replay of the last batch is recognised and changes nothing
    fold = BucketedFold(pk, 1)
    fold.add(data)
    again = apply_folded_changes(bounded_sink, "d.t", fold.buckets(), pk, APP, 2,
                                 workdir=str(tmp_path / "scratch" / "again"), memory_bytes=memory)  # fmt: skip
    assert not again.applied
    assert _read(bounded_sink, "d.t", pk) == _read(merge_sink, "d.t", pk)


def test_bounded_apply_with_metadata_columns_equals_merge(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """metadata_columns: both apply paths write the metadata of the change that won each key."""
    rng = random.Random(7)
    schema, pk = _schema(False)
    lake = lake_schema(schema, True)
    n = 2000
    seed = with_snapshot_metadata(pa.Table.from_pylist([{"id": i, "v": -i, "s": "seed"} for i in range(n)],
                                                       schema=schema), BinlogOffset("f.000001", 2), 1000.0)  # fmt: skip
    merge_sink, bounded_sink = DeltaSink(str(tmp_path / "merge")), DeltaSink(str(tmp_path / "bounded"))
    for s in (merge_sink, bounded_sink):
        _snapshot(s, "d.t", lake, pk, seed.to_pylist(), files=4, tmp=tmp_path)
    for version in range(2):
        data = _batch(rng, schema, pk, n, False, changes=1500)
        up, dels = fold_block(data.sort_by("seq"), pk, with_metadata=True)
        merge_sink.apply_changes("d.t", up, dels, pk, APP, version)
        fold = BucketedFold(pk, 4, str(tmp_path / "scratch" / f"fold-{version}"), with_metadata=True)
        fold.add(data)
        apply_folded_changes(bounded_sink, "d.t", fold.buckets(), pk, APP, version,
                             workdir=str(tmp_path / "scratch" / f"keys-{version}"), memory_bytes=8192)  # fmt: skip
        fold.close()
        assert _read(bounded_sink, "d.t", pk) == _read(merge_sink, "d.t", pk)
    rows = _read(merge_sink, "d.t", pk)
    # each change wrote v = its seq at position 4 + seq, time seq: the row shows the last one
    for r in rows:
        if r["_op"] == "r":
            assert (r["v"], r["_binlog_pos"]) == (-r["id"], 2), r
        else:
            assert r["_op"] in ("c", "u") and r["_binlog_pos"] == 4 + r["v"], r
            assert r["_commit_ts"].timestamp() == r["v"] and r["_binlog_file"] == "f.000001", r
    assert {r["_op"] for r in rows} == {"r", "c", "u"}


def test_bounded_apply_prunes_files_by_key_statistics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Inserts beyond the table's keys touch no existing file: nothing is read or rewritten."""
    schema, pk = _schema(False)
    sink = DeltaSink(str(tmp_path / "lake"))
    _snapshot(sink, "d.t", schema, pk, [{"id": i, "v": i, "s": "x"} for i in range(5000)], files=5, tmp=tmp_path)
    b = BlockBuilder(block_schema(schema, pk))
    for i in range(5000, 9000):
        b.add("c", "f", 4, 1, i, 0, i, 0, None, {"id": i, "v": i, "s": "new"})
    fold = BucketedFold(pk, 2, str(tmp_path / "fold"))
    fold.add(b.build())
    res = apply_folded_changes(sink, "d.t", fold.buckets(), pk, APP, 0, workdir=str(tmp_path / "k"),
                               memory_bytes=1 << 20)  # fmt: skip
    assert res.files_removed == 0 and res.rows_copied == 0 and res.upserts == 4000
    rows = _read(sink, "d.t", pk)
    assert [r["id"] for r in rows] == list(range(9000))


def test_bounded_apply_rewrites_files_written_before_an_added_column(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Files from before ADD COLUMN lack the column: their copied rows read NULL in it, as in a MERGE."""
    schema, pk = _schema(False)
    wider = schema.append(pa.field("extra", pa.string()))
    sinks = DeltaSink(str(tmp_path / "merge")), DeltaSink(str(tmp_path / "bounded"))
    for s in sinks:
        _snapshot(s, "d.t", schema, pk, [{"id": i, "v": i, "s": "old"} for i in range(1000)], files=4, tmp=tmp_path)
        s.evolve_schema("d.t", wider, pk)
    b = BlockBuilder(block_schema(wider, pk))
    for i in range(0, 1000, 3):
        b.add("u", "f", 4, 1, i, 0, i, 0, {"id": i}, {"id": i, "v": -i, "s": "new", "extra": f"x{i}"})
    for i in range(1, 1000, 7):
        b.add("d", "f", 4, 1, 5000 + i, 0, 5000 + i, 0, {"id": i}, None)
    data = pa.Table.from_batches([b.build()])
    up, dels = fold_block(data.sort_by("seq"), pk)
    sinks[0].apply_changes("d.t", up, dels, pk, APP, 0)
    fold = BucketedFold(pk, 2, str(tmp_path / "fold"))
    fold.add(data)
    apply_folded_changes(sinks[1], "d.t", fold.buckets(), pk, APP, 0, workdir=str(tmp_path / "k"), memory_bytes=1 << 20)
    assert _read(sinks[1], "d.t", pk) == _read(sinks[0], "d.t", pk)
    assert {r["extra"] for r in _read(sinks[1], "d.t", pk) if r["s"] == "old"} == {None}
