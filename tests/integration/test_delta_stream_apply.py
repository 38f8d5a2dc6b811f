"""Stream micro-batches into Delta with real delta-rs on temporary directories (no mocks).

Every test keeps an in-memory model of the source table (a dict keyed by primary key) and compares
the whole Delta table with it. Tables are read with DataFusion (``QueryBuilder``), not
``DeltaTable.to_pyarrow_table``: the latter's pyarrow dataset over delta-rs' filesystem handler
aborts the interpreter at exit now and then (``terminate called without an active exception``,
seen in ~40% of short scripts with deltalake 1.6.6 / pyarrow 26).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import QueryBuilder
from deltalake.exceptions import CommitFailedError

from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema
from airflow_provider_mysqlcdc.core.types import arrow_schema, rows_to_arrow
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink, UnsupportedSchemaChange
from tests.support.reference_fold import fold_changes, keys_to_arrow

TABLE = "shop.orders"
APP = "mysqlcdc-stream-test"
UTC = dt.UTC

Model = dict[tuple[Any, ...], dict[str, Any]]
Change = tuple[str, dict[str, Any] | None, dict[str, Any] | None]


# ----------------------------------------------------------------------------------------- helpers
def _col(name: str, ordinal: int, column_type: str, nullable: bool = True, **kw: Any) -> ColumnInfo:
    data_type = column_type.split("(")[0].split()[0].lower()
    return ColumnInfo(name, ordinal, data_type, column_type, nullable, **kw)


def _schema(*extra: ColumnInfo, changes: dict[str, ColumnInfo] | None = None, table: str = TABLE) -> TableSchema:
    """``orders``: the MySQL types the stream carries most (see core/types.py for their Arrow types)."""
    cols = [
        _col("id", 1, "bigint(20)", nullable=False),
        _col("name", 2, "varchar(10)", charset="utf8mb4", collation="utf8mb4_general_ci", char_max_length=10),
        _col("qty", 3, "int(11)"),
        _col("price", 4, "float"),
        _col("amount", 5, "decimal(10,2)", numeric_precision=10, numeric_scale=2),
        _col("ts", 6, "datetime(6)", datetime_precision=6),
        _col("data", 7, "varbinary(20)"),
    ]
    cols = [(changes or {}).get(c.name, c) for c in cols] + list(extra)
    return TableSchema(TableId.parse(table), cols, ["id"])


def _row(ts: TableSchema, key: int, v: int, **overrides: Any) -> dict[str, Any]:
    row = {
        "id": key,
        "name": f"n{v}",
        "qty": v,
        "price": float(v) + 0.5,
        "amount": Decimal(v).scaleb(-2).quantize(Decimal("0.01")) + Decimal(v),
        "ts": dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=v),
        "data": bytes([v % 256]) * 3,
    }
    for c in ts.columns[7:]:
        row[c.name] = None
    row.update(overrides)
    return row


def _read(sink: DeltaSink, table: str, key: tuple[str, ...] = ("id",)) -> Model:
    """The whole Delta table keyed by ``key``; fails on a duplicate key (a MERGE bug)."""
    reader = QueryBuilder().register("t", sink.open(table)).execute("SELECT * FROM t")
    out: Model = {}
    for r in pa.table(reader.read_all()).to_pylist():
        k = tuple(r[c] for c in key)
        assert k not in out, f"duplicate key {k} in the Delta table"
        out[k] = r
    return out


def _expect(model: Model, ts: TableSchema) -> Model:
    """The model as the Delta table must hold it: every column of ``ts``, NULL where a row lacks one."""
    names = [c.name for c in ts.columns]
    return {k: {n: r.get(n) for n in names} for k, r in model.items()}


def _apply(
    sink: DeltaSink, ts: TableSchema, changes: list[Change], version: int, table: str = TABLE, app: str = APP
) -> bool:
    """What the stream does with one batch of one table: fold, convert to Arrow, MERGE."""
    upserts, deletes = fold_changes(changes, ts.primary_key)
    schema = arrow_schema(ts)
    up = rows_to_arrow(upserts, ts) if upserts else schema.empty_table()
    return sink.apply_changes(table, up, keys_to_arrow(deletes, ts.primary_key, schema), ts.primary_key, app, version)


def _replay_model(model: Model, changes: list[Change]) -> None:
    for op, before, after in changes:
        if op in ("u", "d"):
            assert before is not None
            model.pop((before["id"],), None)
        if op in ("c", "u"):
            assert after is not None
            model[(after["id"],)] = after


def _random_batch(rng: random.Random, ts: TableSchema, source: Model, n: int, key_space: int) -> list[Change]:
    """``n`` changes MySQL could log against ``source`` (mutated): inserts, updates, key moves, deletes."""
    changes: list[Change] = []
    for _ in range(n):
        kind = rng.random()
        present = list(source)
        if kind < 0.35 or not present:
            k = rng.randrange(key_space)
            if (k,) in source:
                continue
            after = _row(ts, k, rng.randrange(1000))
            changes.append(("c", None, after))
        elif kind < 0.75:
            old = rng.choice(present)
            new_key = old[0]
            if rng.random() < 0.25:  # key move to a free key
                cand = rng.randrange(key_space)
                new_key = cand if (cand,) not in source else old[0]
            after = _row(ts, new_key, rng.randrange(1000))
            changes.append(("u", source[old], after))
        else:
            old = rng.choice(present)
            changes.append(("d", source[old], None))
        _replay_model(source, changes[-1:])
    return changes


def _snapshot(sink: DeltaSink, ts: TableSchema, rows: list[dict[str, Any]], group: str, files: int = 1) -> int:
    """Load rows the way a snapshot group does: staged Parquet files adopted in one commit."""
    table = str(ts.table)
    schema = arrow_schema(ts)
    sink.prepare_table(table, schema, ts.primary_key)
    location = sink.staging_location(table, group, "attempt-1")
    os.makedirs(location, exist_ok=True)
    staged = []
    per = max(1, -(-len(rows) // files))
    for i in range(0, len(rows), per):
        path = f"{location}/part-{i:06d}.parquet"
        part = rows[i : i + per]
        pq.write_table(rows_to_arrow(part, ts), path)
        staged.append(StagedFile(path, len(part), os.path.getsize(path)))
    return sink.commit_snapshot_group(table, group, staged, schema, {"group": group})


def _setup(tmp_path: Path, rows: int = 200, path: str = "merge") -> tuple[DeltaSink, TableSchema, Model]:
    """``path``: "merge", "rewrite" — a small table's batch applied by the file rewrite
    (``DeltaSink.rewrite_below_bytes``, what the stream does for small tables) — or "mark": a small
    table whose superseded copy is still within its grace (an hour here), so every batch after the
    first marks its changed rows with deletion vectors instead."""
    sink = DeltaSink(str(tmp_path / "lake"), rewrite_below_bytes=(1 << 30) if path in ("rewrite", "mark") else 0,
                     deletion_vectors=path == "mark", small_table_retention_seconds=3600 if path == "mark" else None)
    ts = _schema()
    initial = [_row(ts, k, k) for k in range(rows)]
    _snapshot(sink, ts, initial, "g0")
    return sink, ts, {(r["id"],): r for r in initial}


# ------------------------------------------------------------------------------------ apply/MERGE
APPLY_PATHS = pytest.mark.parametrize("path", ["merge", "rewrite", "mark"])


@APPLY_PATHS
def test_random_batches_of_upserts_deletes_and_key_moves_match_the_model(tmp_path: Path, path: str) -> None:
    sink, ts, source = _setup(tmp_path, path=path)
    rng = random.Random(7)
    kinds: set[str] = set()
    for version in range(1, 13):
        changes = _random_batch(rng, ts, source, rng.randrange(1, 120), key_space=400)
        kinds |= {op if op != "u" or b["id"] == a["id"] else "move" for op, b, a in changes}  # type: ignore[index]
        assert _apply(sink, ts, changes, version) is True
        assert _read(sink, TABLE) == source, f"Delta table differs from the source after batch {version}"
        assert sink.open(TABLE).transaction_version(APP) == version
    assert kinds == {"c", "u", "d", "move"}, "the random batches must exercise every kind of change"


@APPLY_PATHS
def test_one_batch_with_every_case_of_one_key(tmp_path: Path, path: str) -> None:
    sink, ts, model = _setup(tmp_path, rows=10, path=path)
    r = {k: _row(ts, k, k) for k in range(10)}
    changes: list[Change] = [
        ("u", r[1], _row(ts, 1, 100)),  # plain update ...
        ("u", _row(ts, 1, 100), _row(ts, 1, 101)),  # ... updated again: the last one wins
        ("d", r[2], None),
        ("c", None, _row(ts, 2, 200)),  # insert after delete of the same key: upsert
        ("c", None, _row(ts, 50, 50)),
        ("d", _row(ts, 50, 50), None),  # delete after insert: delete
        ("u", r[3], _row(ts, 30, 3)),  # key move out ...
        ("u", r[4], _row(ts, 3, 4)),  # ... and another row moved onto the freed key
        ("d", r[5], None),
        ("c", None, _row(ts, 11, 11)),
    ]
    assert _apply(sink, ts, changes, 1)
    _replay_model(model, changes)
    got = _read(sink, TABLE)
    assert got == model
    assert got[(1,)]["qty"] == 101 and (50,) not in got and (4,) not in got and got[(3,)]["qty"] == 4


@APPLY_PATHS
def test_replaying_the_same_batch_id_is_a_no_op(tmp_path: Path, path: str) -> None:
    sink, ts, model = _setup(tmp_path, rows=20, path=path)
    batch: list[Change] = [("u", _row(ts, 1, 1), _row(ts, 1, 500)), ("c", None, _row(ts, 99, 99))]
    assert _apply(sink, ts, batch, 5)
    _replay_model(model, batch)
    version = sink.open(TABLE).version()
    # The same id again — even with different content — must not commit: the id alone decides.
    assert _apply(sink, ts, [("d", _row(ts, 99, 99), None), ("c", None, _row(ts, 98, 98))], 5) is False
    assert sink.open(TABLE).version() == version
    assert _read(sink, TABLE) == model


@APPLY_PATHS
def test_a_lower_batch_id_is_a_no_op(tmp_path: Path, path: str) -> None:
    sink, ts, model = _setup(tmp_path, rows=5, path=path)
    first: list[Change] = [("u", _row(ts, 1, 1), _row(ts, 1, 10))]
    second: list[Change] = [("u", _row(ts, 1, 10), _row(ts, 1, 20))]
    assert _apply(sink, ts, first, 1) and _apply(sink, ts, second, 2)
    _replay_model(model, first + second)
    assert _apply(sink, ts, first, 1) is False  # would set qty back to 10
    assert _read(sink, TABLE) == model and model[(1,)]["qty"] == 20


def test_two_tables_keep_independent_batch_ids(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "lake"))
    ts_a, ts_b = _schema(table="shop.a"), _schema(table="shop.b")
    _snapshot(sink, ts_a, [_row(ts_a, 1, 1)], "g0")
    _snapshot(sink, ts_b, [_row(ts_b, 1, 1)], "g0")
    assert _apply(sink, ts_a, [("c", None, _row(ts_a, 2, 2))], 5, table="shop.a")
    assert _apply(sink, ts_b, [("c", None, _row(ts_b, 2, 2))], 2, table="shop.b")
    # batch 3: table a is already past it, table b is not
    assert _apply(sink, ts_a, [("c", None, _row(ts_a, 3, 3))], 3, table="shop.a") is False
    assert _apply(sink, ts_b, [("c", None, _row(ts_b, 3, 3))], 3, table="shop.b") is True
    assert sorted(_read(sink, "shop.a")) == [(1,), (2,)]
    assert sorted(_read(sink, "shop.b")) == [(1,), (2,), (3,)]
    assert sink.open("shop.a").transaction_version(APP) == 5
    assert sink.open("shop.b").transaction_version(APP) == 3
    # another application id (e.g. a second pipeline) has its own versions on the same table
    assert _apply(sink, ts_a, [("c", None, _row(ts_a, 4, 4))], 1, table="shop.a", app="other") is True


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import pyarrow.parquet as pq
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    root, table, app, version, batch_dir, checkpoint = sys.argv[1:]
    sink = DeltaSink(root)
    applied = sink.apply_changes(table, pq.read_table(f"{batch_dir}/up.parquet"),
                                 pq.read_table(f"{batch_dir}/del.parquet"), ["id"], app, int(version))
    assert applied
    os.kill(os.getpid(), signal.SIGKILL)  # crash after the Delta commit, before the checkpoint
    open(checkpoint, "w").write(version)
    """
)


def test_crash_between_delta_commit_and_checkpoint_skips_the_replay(tmp_path: Path) -> None:
    sink, ts, model = _setup(tmp_path, rows=50)
    schema = arrow_schema(ts)
    batch: list[Change] = [
        ("u", _row(ts, 1, 1), _row(ts, 1, 111)),
        ("u", _row(ts, 2, 2), _row(ts, 200, 2)),  # key move
        ("d", _row(ts, 3, 3), None),
        ("c", None, _row(ts, 300, 300)),
    ]
    upserts, deletes = fold_changes(batch, ["id"])
    batch_dir, checkpoint = tmp_path / "batch", tmp_path / "checkpoint"
    batch_dir.mkdir()
    pq.write_table(rows_to_arrow(upserts, ts), batch_dir / "up.parquet")
    pq.write_table(keys_to_arrow(deletes, ["id"], schema), batch_dir / "del.parquet")

    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, sink.root, TABLE, APP, "7", str(batch_dir), str(checkpoint)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not checkpoint.exists(), "the child must die before its checkpoint"
    _replay_model(model, batch)
    assert _read(sink, TABLE) == model, "the crashed child's commit must be complete"
    version = sink.open(TABLE).version()

    # The restarted stream has no checkpoint for batch 7 and replays it.
    assert _apply(sink, ts, batch, 7) is False
    assert sink.open(TABLE).version() == version
    assert _read(sink, TABLE) == model
    # ... and carries on with the next batch.
    nxt: list[Change] = [("u", _row(ts, 300, 300), _row(ts, 300, 301))]
    assert _apply(sink, ts, nxt, 8)
    _replay_model(model, nxt)
    assert _read(sink, TABLE) == model


@APPLY_PATHS
def test_empty_and_one_sided_batches(tmp_path: Path, path: str) -> None:
    sink, ts, model = _setup(tmp_path, rows=5, path=path)
    version = sink.open(TABLE).version()
    assert _apply(sink, ts, [], 1) is False, "an empty batch makes no commit"
    assert sink.open(TABLE).version() == version and sink.open(TABLE).transaction_version(APP) is None

    only_deletes: list[Change] = [("d", _row(ts, 1, 1), None)]
    assert _apply(sink, ts, only_deletes, 2)
    only_upserts: list[Change] = [("c", None, _row(ts, 10, 10))]
    assert _apply(sink, ts, only_upserts, 3)
    _replay_model(model, only_deletes + only_upserts)
    assert _read(sink, TABLE) == model

    # Deleting an absent key changes no file; delta-rs then writes no commit, so the sink records
    # the batch id with an empty commit: the replay must still be recognised.
    absent: list[Change] = [("d", _row(ts, 12345, 1), None)]
    before = sink.open(TABLE).version()
    assert _apply(sink, ts, absent, 4) is True
    assert sink.open(TABLE).version() == before + 1 and sink.open(TABLE).transaction_version(APP) == 4
    assert _apply(sink, ts, absent, 4) is False
    assert _read(sink, TABLE) == model


def test_string_keys_are_distinct_by_exact_value(tmp_path: Path) -> None:
    """'k', 'K' and 'k ' are one key under utf8mb4_general_ci but three stored values: three rows."""
    sink = DeltaSink(str(tmp_path / "lake"))
    ts = TableSchema(
        TableId.parse("shop.tags"),
        [_col("k", 1, "varchar(8)", nullable=False, charset="utf8mb4"), _col("n", 2, "int(11)")],
        ["k"],
    )
    _snapshot(sink, ts, [{"k": "k", "n": 1}], "g0")
    batch: list[Change] = [
        ("d", {"k": "k", "n": 1}, None),
        ("c", None, {"k": "K", "n": 2}),
        ("c", None, {"k": "k ", "n": 3}),
        ("c", None, {"k": "k'\\", "n": 4}),
    ]
    assert _apply(sink, ts, batch, 1, table="shop.tags")
    assert _read(sink, "shop.tags", key=("k",)) == {
        ("K",): {"k": "K", "n": 2}, ("k ",): {"k": "k ", "n": 3}, ("k'\\",): {"k": "k'\\", "n": 4},
    }


def test_bad_batches_are_refused_before_any_commit(tmp_path: Path) -> None:
    sink, ts, _ = _setup(tmp_path, rows=5)
    schema = arrow_schema(ts)
    version = sink.open(TABLE).version()
    dup = rows_to_arrow([_row(ts, 1, 1)], ts)
    with pytest.raises(ValueError, match="more than once"):
        sink.apply_changes(TABLE, dup, keys_to_arrow([(1,)], ["id"], schema), ["id"], APP, 1)
    wider = rows_to_arrow([_row(ts, 1, 1)], ts).append_column("extra", pa.array([1]))
    with pytest.raises(ValueError, match="evolve_schema"):
        sink.apply_changes(TABLE, wider, keys_to_arrow([], ["id"], schema), ["id"], APP, 1)
    partial = rows_to_arrow([_row(ts, 1, 1)], ts).drop_columns(["qty"])
    with pytest.raises(ValueError, match="full rows"):
        sink.apply_changes(TABLE, partial, keys_to_arrow([], ["id"], schema), ["id"], APP, 1)
    assert sink.open(TABLE).version() == version


def test_merge_skips_files_outside_the_batch_key_range(tmp_path: Path) -> None:
    """Data skipping, proven without timing: a corrupt file outside the key range is never opened.

    The snapshot commit writes min/max statistics for the key; the MERGE must prune by them. If it
    read every file (delta-rs' default streamed MERGE does), the corrupt file would fail the batch.
    """
    sink = DeltaSink(str(tmp_path / "lake"))
    ts = _schema()
    _snapshot(sink, ts, [_row(ts, k, k) for k in range(4000)], "g0", files=4)
    files = sorted(p.removeprefix("file://") for p in sink.open(TABLE).file_uris())
    first = next(f for f in files if pq.read_table(f).column("id")[0].as_py() == 0)
    Path(first).write_bytes(b"not parquet" * 100)  # keys 0..999 are now unreadable

    model = {(k,): _row(ts, k, k) for k in range(1000, 4000)}
    batch: list[Change] = [("u", _row(ts, k, k), _row(ts, k, -k)) for k in range(3500, 3600)]
    batch += [("c", None, _row(ts, k, k)) for k in range(5000, 5100)] + [("d", _row(ts, 2000, 2000), None)]
    assert _apply(sink, ts, batch, 1)
    _replay_model(model, batch)
    metrics = sink.open(TABLE).history(1)[0]["operationMetrics"]
    assert metrics["num_target_files_removed"] == 2, "only the files holding keys 2000 and 3500..3599"
    assert first.removeprefix(sink.root) in str(sink.open(TABLE).file_uris())
    # the corruption is real: a batch that touches it fails
    with pytest.raises(Exception):  # noqa: B017 - delta-rs reports it as a generic DeltaError/OSError
        _apply(sink, ts, [("u", _row(ts, 5, 5), _row(ts, 5, 6))], 2)


# -------------------------------------------------------------------------------- concurrency
@pytest.mark.parametrize(("group_keys", "retried"), [(range(1000, 1100), False), (range(200, 300), True)])
def test_snapshot_commit_between_read_and_merge_is_not_lost(tmp_path: Path, group_keys: range, retried: bool) -> None:
    """A snapshot group commits after the MERGE read the table, and neither write is lost.

    delta-rs checks the MERGE's read predicate (the batch's key range, from the early pruning
    filter) against the files the group added, using their key statistics: files outside the
    range (keys 1000..) do not conflict and the MERGE commits on top; files inside it (200..299,
    within the batch's 5..500) do, and the sink re-reads the table and merges again.
    """
    sink, ts, model = _setup(tmp_path, rows=100)
    group_rows = [_row(ts, k, k) for k in group_keys]
    calls: list[int] = []

    def snapshot_commits_now() -> None:
        calls.append(sink.open(TABLE).version())
        if len(calls) == 1:
            _snapshot(sink, ts, group_rows, "g1")

    batch: list[Change] = [("u", _row(ts, 5, 5), _row(ts, 5, 55)), ("c", None, _row(ts, 500, 500))]
    upserts, deletes = fold_changes(batch, ["id"])
    assert sink.apply_changes(
        TABLE, rows_to_arrow(upserts, ts), keys_to_arrow(deletes, ["id"], arrow_schema(ts)), ["id"], APP, 1,
        before_merge=snapshot_commits_now,
    )
    if retried:
        assert len(calls) == 2 and calls[1] == calls[0] + 1, "the MERGE must have re-run on the new snapshot"
    else:
        assert len(calls) == 1
    _replay_model(model, batch)
    model.update({(r["id"],): r for r in group_rows})
    assert _read(sink, TABLE) == model
    assert sink.open(TABLE).transaction_version(APP) == 1


def test_concurrent_snapshot_groups_and_stream_batches(tmp_path: Path) -> None:
    """Free-running threads: 8 snapshot groups (disjoint keys) and 8 stream batches on one table.

    The stream side needs no help: a conflicting MERGE is re-run by ``apply_changes``. The group
    side can fail: ``commit_snapshot_group`` retries only a lost race for the version number, and
    delta-rs rejects its append when a MERGE rewrote a file after the group read the table
    ("a concurrent transaction deleted data this operation read"). That failure commits nothing,
    and re-running the group commit (what Airflow's task retry does) succeeds — which this test
    does, and counts. Either way nothing may be lost or duplicated.
    """
    sink, ts, model = _setup(tmp_path, rows=100)
    rng = random.Random(3)
    stream_model = dict(model)
    batches = [_random_batch(rng, ts, stream_model, 30, key_space=500) for _ in range(8)]
    groups = [[_row(ts, k, k) for k in range(10_000 + 100 * g, 10_000 + 100 * g + 100)] for g in range(8)]
    errors: list[BaseException] = []
    group_retries: list[str] = []

    def stream() -> None:
        try:
            for v, b in enumerate(batches, start=1):
                assert _apply(sink, ts, b, v)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def snapshots() -> None:
        try:
            for g, rows in enumerate(groups, start=1):
                for _attempt in range(10):
                    try:
                        _snapshot(sink, ts, rows, f"g{g}")
                        break
                    except CommitFailedError as exc:  # the task retry
                        group_retries.append(str(exc).splitlines()[0])
                else:
                    raise AssertionError(f"group {g} never committed: {group_retries[-1]}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=stream), threading.Thread(target=snapshots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    expected = dict(stream_model)
    for rows in groups:
        expected.update({(r["id"],): r for r in rows})
    assert _read(sink, TABLE) == expected
    assert sink.open(TABLE).transaction_version(APP) == len(batches)
    print(f"snapshot group commits retried after a concurrent MERGE: {len(group_retries)}")


# ------------------------------------------------------------------------------- schema changes
def test_add_columns_is_metadata_only_and_new_rows_carry_them(tmp_path: Path) -> None:
    sink, ts, model = _setup(tmp_path, rows=30)
    assert _apply(sink, ts, [("u", _row(ts, 1, 1), _row(ts, 1, 10))], 1)
    _replay_model(model, [("u", _row(ts, 1, 1), _row(ts, 1, 10))])
    files_before = set(sink.open(TABLE).file_uris())

    # ALTER TABLE orders ADD COLUMN note VARCHAR(20), ADD COLUMN seen_at DATETIME(6)
    ts2 = _schema(
        _col("note", 8, "varchar(20)", charset="utf8mb4", char_max_length=20),
        _col("seen_at", 9, "datetime(6)", datetime_precision=6),
    )
    result = sink.evolve_schema(TABLE, arrow_schema(ts2), ["id"])
    assert result.added == ("note", "seen_at") and not result.widened and not result.rewritten
    assert set(sink.open(TABLE).file_uris()) == files_before, "adding columns must not rewrite data"
    assert _read(sink, TABLE) == _expect(model, ts2), "old rows read NULL in the new columns"
    assert sink.evolve_schema(TABLE, arrow_schema(ts2), ["id"]).changed is False, "idempotent"

    seen = dt.datetime(2025, 5, 5, 5, 5, 5, 5, tzinfo=UTC)
    batch: list[Change] = [
        ("u", _expect(model, ts2)[(2,)], _row(ts2, 2, 20, note="hello", seen_at=seen)),
        ("c", None, _row(ts2, 100, 100, note="new")),
    ]
    assert _apply(sink, ts2, batch, 2)
    _replay_model(model, batch)
    assert _read(sink, TABLE) == _expect(model, ts2)


def test_widening_rewrites_in_one_commit_and_keeps_batch_ids(tmp_path: Path) -> None:
    sink, ts, model = _setup(tmp_path, rows=40)
    first: list[Change] = [("u", _row(ts, 1, 1), _row(ts, 1, 10))]
    assert _apply(sink, ts, first, 1)
    _replay_model(model, first)
    version = sink.open(TABLE).version()

    # ALTER TABLE orders MODIFY qty BIGINT, MODIFY price DOUBLE, MODIFY amount DECIMAL(14,2),
    #   MODIFY name VARCHAR(200), ADD COLUMN flag TINYINT
    ts3 = _schema(
        _col("flag", 8, "tinyint(4)"),
        changes={
            "qty": _col("qty", 3, "bigint(20)"),
            "price": _col("price", 4, "double"),
            "amount": _col("amount", 5, "decimal(14,2)", numeric_precision=14, numeric_scale=2),
            "name": _col("name", 2, "varchar(200)", charset="utf8mb4", char_max_length=200),
        },
    )
    result = sink.evolve_schema(TABLE, arrow_schema(ts3), ["id"])
    assert result.rewritten and result.added == ("flag",)
    assert {c for c, _, _ in result.widened} == {"qty", "price", "amount"}, "VARCHAR length is no change"
    assert sink.open(TABLE).version() == version + 1, "widening + adding must be one commit"
    assert sink.open(TABLE).transaction_version(APP) == 1, "batch ids survive the rewrite"

    delta_types = {f.name: f.type for f in pa.schema(sink.open(TABLE).schema().to_arrow())}
    assert delta_types["qty"] == pa.int64() and delta_types["price"] == pa.float64()
    assert delta_types["amount"] == pa.decimal128(14, 2) and delta_types["flag"] == pa.int8()
    for uri in sink.open(TABLE).file_uris():  # every data file physically carries the new types
        physical = pq.read_schema(uri.removeprefix("file://"))
        assert physical.field("qty").type == pa.int64() and physical.field("price").type == pa.float64()
        assert physical.field("amount").type == pa.decimal128(14, 2)
    assert _read(sink, TABLE) == _expect(model, ts3), "values survive the widening"

    assert _apply(sink, ts, first, 1) is False, "a replay of an old batch id is still skipped"
    big = _row(ts3, 2, 2, qty=2**40, price=1 / 3, amount=Decimal("123456789012.34"), flag=-5)
    batch: list[Change] = [("u", _expect(model, ts3)[(2,)], big), ("c", None, _row(ts3, 77, 77, flag=1))]
    assert _apply(sink, ts3, batch, 2)
    _replay_model(model, batch)
    got = _read(sink, TABLE)
    assert got == _expect(model, ts3)
    assert got[(2,)]["qty"] == 2**40 and got[(2,)]["price"] == 1 / 3


def test_snapshot_commit_during_a_widening_rewrite_is_rewritten_too(tmp_path: Path) -> None:
    """A group appends int32 files after the rewrite read the table: the rewrite must conflict and
    run again, or those files would stay in a table whose schema now says int64."""
    sink, ts, model = _setup(tmp_path, rows=30)
    group_rows = [_row(ts, k, k) for k in range(500, 520)]
    calls: list[int] = []

    def snapshot_commits_now() -> None:
        calls.append(sink.open(TABLE).version())
        if len(calls) == 1:
            _snapshot(sink, ts, group_rows, "g1")

    wide = _schema(changes={"qty": _col("qty", 3, "bigint(20)")})
    assert sink.evolve_schema(TABLE, arrow_schema(wide), ["id"], before_commit=snapshot_commits_now).rewritten
    assert len(calls) == 2, "the rewrite must have re-run after the concurrent append"
    for uri in sink.open(TABLE).file_uris():
        assert pq.read_schema(uri.removeprefix("file://")).field("qty").type == pa.int64(), uri
    model.update({(r["id"],): r for r in group_rows})
    assert _read(sink, TABLE) == _expect(model, wide)


def test_widening_an_empty_table(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "lake"))
    ts = _schema()
    sink.prepare_table(TABLE, arrow_schema(ts), ["id"])
    ts2 = _schema(changes={"qty": _col("qty", 3, "bigint(20)")})
    assert sink.evolve_schema(TABLE, arrow_schema(ts2)).rewritten
    assert pa.schema(sink.open(TABLE).schema().to_arrow()).field("qty").type == pa.int64()
    assert _apply(sink, ts2, [("c", None, _row(ts2, 1, 1, qty=2**33))], 1)
    assert _read(sink, TABLE)[(1,)]["qty"] == 2**33


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"qty": _col("qty", 3, "smallint(6)")}, "column 'qty' was narrowed from int32 to int16"),
        ({"price": _col("price", 4, "decimal(10,2)", numeric_precision=10, numeric_scale=2)}, "'price' changed type"),
        ({"amount": _col("amount", 5, "decimal(10,1)", numeric_precision=10, numeric_scale=1)}, "'amount' changed"),
        ({"amount": _col("amount", 5, "decimal(50,2)", numeric_precision=50, numeric_scale=2)}, "'amount' changed"),
        ({"qty": _col("qty", 3, "varchar(10)", charset="utf8mb4")}, "'qty' changed type from int32 to string"),
        ({"ts": _col("ts", 6, "date")}, "'ts' changed type"),
    ],
)
def test_incompatible_type_changes_are_refused(tmp_path: Path, change: dict[str, ColumnInfo], message: str) -> None:
    sink, _, model = _setup(tmp_path, rows=5)
    version = sink.open(TABLE).version()
    with pytest.raises(UnsupportedSchemaChange, match=message) as info:
        sink.evolve_schema(TABLE, arrow_schema(_schema(changes=change)), ["id"])
    assert "Re-snapshot shop.orders" in str(info.value)
    assert sink.open(TABLE).version() == version, "a refused change commits nothing"
    assert _read(sink, TABLE) == model


def test_narrowing_after_a_widening_is_refused(tmp_path: Path) -> None:
    sink, _, _ = _setup(tmp_path, rows=5)
    wide = _schema(changes={"qty": _col("qty", 3, "bigint(20)"), "price": _col("price", 4, "double")})
    sink.evolve_schema(TABLE, arrow_schema(wide), ["id"])
    with pytest.raises(UnsupportedSchemaChange, match=r"'qty' was narrowed from int64 to int32.*'price' was narrowed"):
        sink.evolve_schema(TABLE, arrow_schema(_schema()), ["id"])


def test_dropped_column_and_changed_primary_key_are_refused(tmp_path: Path) -> None:
    sink, ts, _ = _setup(tmp_path, rows=5)
    dropped = TableSchema(ts.table, [c for c in ts.columns if c.name != "data"], ["id"])
    with pytest.raises(UnsupportedSchemaChange, match="column 'data' was dropped"):
        sink.evolve_schema(TABLE, arrow_schema(dropped), ["id"])
    with pytest.raises(UnsupportedSchemaChange, match=r"primary key changed from \(id\) to \(id, name\)"):
        sink.evolve_schema(TABLE, arrow_schema(ts), ["id", "name"])
    assert sink.evolve_schema(TABLE, arrow_schema(ts), ["id"]).changed is False
