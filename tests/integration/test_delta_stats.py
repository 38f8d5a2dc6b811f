"""Readers that prune files by their statistics read every write path's files right.

delta-rs' pyarrow dataset prunes a file whose statistics lack a column the table indexes (it
guarantees ``col >= null``): a filter on a non-key column once returned no rows from the files
this package adds itself. Real delta-rs tables; each write path (snapshot adoption, MERGE, bounded
rewrite, small-table rewrite, column fill, re-snapshot swap) is followed by equality and range
filters on every column, checked against a full read, and the key columns keep the statistics MERGE
prunes on.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_provider_mysqlcdc.core.change_block import BlockBuilder, block_schema, fold_block
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_fill import fill_columns
from airflow_provider_mysqlcdc.sinks.delta_rewrite import apply_folded_changes
from airflow_provider_mysqlcdc.sinks.delta_stats import declared_stats_columns
from airflow_provider_mysqlcdc.spill.bucketed_fold import BucketedFold

REPO = Path(__file__).resolve().parents[2]
TABLE = "d.t"
APP = "mysqlcdc-stream-stats"
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), False), pa.field("name", pa.string(), False),
    pa.field("at", pa.timestamp("us", tz="UTC"), False), pa.field("amount", pa.decimal128(12, 2)),
    pa.field("ratio", pa.float64()), pa.field("day", pa.date32()), pa.field("note", pa.string()),
])  # fmt: skip
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def _row(i: int, v: int = 0) -> dict[str, Any]:
    return {"id": i, "name": f"n{i:05d}", "at": T0 + dt.timedelta(seconds=i), "amount": decimal.Decimal(i + v) / 4,
            "ratio": (i * 7 + v) % 11 / 3, "day": dt.date(2024, 1, 1) + dt.timedelta(days=(i + v) % 40),
            "note": None if i % 5 == 0 else f"note-{(i + v) % 13}"}  # fmt: skip


def _check_reads(sink: DeltaSink, key: list[str], all_files_have_stats: bool = True) -> None:
    """Every filtered read agrees with a full read, and every file has its declared key statistics."""
    uri = sink.table_uri(TABLE)
    proc = subprocess.run([sys.executable, "-m", "tests.support.delta_reads", uri], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"the reader child printed nothing (exit {proc.returncode}): {proc.stderr[-2000:]}"
    result = json.loads(lines[-1])
    assert result["checked"] >= 20 and result["mismatches"] == [], result
    # delta-rs' MERGE writes string_view files that pyarrow cannot filter (upstream, not statistics)
    assert all("string_view" in f for f in result["failed"]), result["failed"]
    table = DeltaTable(uri)
    declared = declared_stats_columns(table.metadata().configuration)
    assert declared == [c for c in key if c in ("id", "name")], declared
    adds = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    for c in declared if all_files_have_stats else []:
        assert all(v is not None for v in adds[f"min.{c}"]), (c, adds[f"min.{c}"])  # MERGE prunes on them


def _stage(sink: DeltaSink, group: str, rows: list[dict[str, Any]], files: int) -> list[StagedFile]:
    staged = []
    per = max(1, len(rows) // files)
    for n, i in enumerate(range(0, len(rows), per)):
        path = f"{sink.staging_location(TABLE, group, 'a1')}/part-{n:05d}.parquet"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows[i : i + per], schema=SCHEMA), path)
        staged.append(StagedFile(path, len(rows[i : i + per]), os.path.getsize(path)))
    return staged


def _changes(key: list[str], ids: range, v: int, deleted: range) -> pa.Table:
    b = BlockBuilder(block_schema(SCHEMA, key))
    for seq, i in enumerate(ids):
        b.add("u", "f.000001", 4 + seq, 1, seq, 0, seq, seq, {c: _row(i)[c] for c in key}, _row(i, v))
    for seq, i in enumerate(deleted, start=len(ids)):
        b.add("d", "f.000001", 4 + seq, 1, seq, 0, seq, seq, {c: _row(i)[c] for c in key}, None)
    return pa.Table.from_batches([b.build()])


@pytest.mark.parametrize("key", [["id"], ["name", "id"], ["at"]], ids=["int", "composite", "timestamp"])
def test_filters_on_every_column_read_every_write_path_right(tmp_path: Path, key: list[str]) -> None:
    sink = DeltaSink(str(tmp_path / "lake"))
    sink.prepare_table(TABLE, SCHEMA, key)
    rows = [_row(i) for i in range(2000)]
    sink.commit_snapshot_group(TABLE, "p1-g00000", _stage(sink, "p1-g00000", rows[:1000], 4), SCHEMA, {})
    sink.commit_snapshot_group(TABLE, "p1-g00001", _stage(sink, "p1-g00001", rows[1000:], 4), SCHEMA, {})
    _check_reads(sink, key)

    up, dels = fold_block(_changes(key, range(100, 300), 1, range(400, 420)), key)  # one MERGE (delta-rs)
    assert sink.apply_changes(TABLE, up, dels, key, APP, 0)
    _check_reads(sink, key)

    fold = BucketedFold(key, 3, str(tmp_path / "fold"))  # the bounded rewrite
    fold.add(_changes(key, range(1500, 1700), 2, range(1800, 1810)))
    res = apply_folded_changes(sink, TABLE, fold.buckets(), key, APP, 1, workdir=str(tmp_path / "keys"),
                               memory_bytes=64 << 20)  # fmt: skip
    fold.close()
    assert res.applied
    _check_reads(sink, key)

    fill_columns(sink, TABLE, {"note": "filled"})
    _check_reads(sink, key)

    small = DeltaSink(str(tmp_path / "lake"), rewrite_below_bytes=1 << 30)  # the whole-table rewrite
    up, dels = fold_block(_changes(key, range(0, 50), 3, range(60, 65)), key)
    assert small.apply_changes(TABLE, up, dels, key, APP, 2)
    _check_reads(sink, key)

    sink.replace_with_files(TABLE, _stage(sink, "p2-g00000", [_row(i, 4) for i in range(1500)], 3), SCHEMA, {})
    _check_reads(sink, key)
    assert sink.read(TABLE).num_rows == 1500


def test_a_table_that_declares_no_statistics_columns_gets_them_on_the_next_prepare(tmp_path: Path) -> None:
    """A table created before tables declared their statistics columns (delta's default: its first
    32 columns): files added meanwhile carry no min/max, and the next prepare declares the key."""
    sink = DeltaSink(str(tmp_path / "lake"))
    uri = sink.table_uri(TABLE)
    os.makedirs(uri, exist_ok=True)
    DeltaTable.create(uri, SCHEMA)
    sink.commit_snapshot_group(TABLE, "p1-g00000", _stage(sink, "p1-g00000", [_row(i) for i in range(500)], 2),
                               SCHEMA, {})  # fmt: skip
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pydict()
    assert "min.id" not in adds or all(v is None for v in adds["min.id"])
    sink.prepare_table(TABLE, SCHEMA, ["id"])
    sink.commit_snapshot_group(TABLE, "p1-g00001", _stage(sink, "p1-g00001", [_row(i) for i in range(500, 900)], 2),
                               SCHEMA, {})  # fmt: skip
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pydict()
    assert sum(v is not None for v in adds["min.id"]) == 2  # the new files: the declared key's range
    _check_reads(sink, ["id"], all_files_have_stats=False)
