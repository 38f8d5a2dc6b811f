"""Small tables committed by writing their Delta log entry directly (sinks/delta_log.py), from the
state the sink carries between batches (sinks/delta_table_state.py), on real delta-rs tables.

The invariant: whatever else commits to the table between two batches, the batch lands on the
table as it is then — never on the stale state — and no log entry is ever overwritten.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_log import CLIENT, LogConflict, commit_actions, unsupported_reason
from airflow_provider_mysqlcdc.storage import LOCAL

TABLE = "shop.items"
APP = "mysqlcdc-log-test"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("qty", pa.int64())])


def _sink(tmp_path: Path) -> DeltaSink:
    sink = DeltaSink(str(tmp_path / "lake"), rewrite_below_bytes=1 << 30)
    sink.prepare_table(TABLE, SCHEMA, ["id"])
    return sink


def _rows(model: dict[int, tuple[str, int]]) -> pa.Table:
    ids = sorted(model)
    return pa.table({"id": ids, "name": [model[i][0] for i in ids], "qty": [model[i][1] for i in ids]}, schema=SCHEMA)


def _apply(sink: DeltaSink, model: dict[int, tuple[str, int]], rng: random.Random, version: int) -> bool:
    upserts: dict[int, tuple[str, int]] = {}
    deletes: set[int] = set()
    for _ in range(rng.randrange(1, 40)):
        k = rng.randrange(300)
        if k in model and rng.random() < 0.25:
            deletes.add(k)
            upserts.pop(k, None)
        else:
            upserts[k] = (f"n{k}-{version}", rng.randrange(1000))
            deletes.discard(k)
    for k in deletes:
        model.pop(k, None)
    model.update(upserts)
    applied = sink.apply_changes(TABLE, _rows(upserts), pa.table({"id": pa.array(sorted(deletes), pa.int64())}),
                                 ["id"], APP, version)  # fmt: skip
    return applied


def _read(sink: DeltaSink) -> dict[int, tuple[str, int]]:
    got = sink.read(TABLE).to_pylist()
    out = {r["id"]: (r["name"], r["qty"]) for r in got}
    assert len(out) == len(got), "a key appears twice in the Delta table"
    return out


def _log_entries(sink: DeltaSink) -> list[dict]:
    log_dir = Path(sink.table_uri(TABLE)) / "_delta_log"
    return [{"version": int(p.name.split(".")[0]), "lines": [json.loads(x) for x in p.read_text().splitlines()]}
            for p in sorted(log_dir.glob("*.json"))]  # fmt: skip


def test_batches_commit_directly_and_follow_other_writers_between_them(tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    model: dict[int, tuple[str, int]] = {}
    rng = random.Random(3)
    other = DeltaSink(str(tmp_path / "lake"))  # another writer: its commits make the stream's state stale
    for version in range(1, 16):
        assert _apply(sink, model, rng, version) is True
        if version % 4 == 0:  # a row appended by someone else, between two batches
            extra = 10_000 + version
            write_deltalake(other.open(TABLE), _rows({extra: ("other", version)}), mode="append")
            model[extra] = ("other", version)
        if version % 5 == 0:  # and a delete by someone else
            victim = min(model)
            other.open(TABLE).delete(f"id = {victim}")
            model.pop(victim)
        assert _read(sink) == model, f"table differs from the model after batch {version}"
    dt = sink.open(TABLE)
    assert dt.transaction_version(APP) == 15
    direct = [e for e in _log_entries(sink) if e["lines"][0]["commitInfo"].get("clientVersion") == CLIENT]
    # the first batch and every batch after another writer's commit read the table again; all commit directly
    assert len(direct) == 15
    assert all(any("txn" in line for line in e["lines"]) for e in direct)
    # one file: each direct commit removed every file the table had
    assert len(dt.file_uris()) == 1


def test_a_replayed_batch_is_skipped_from_the_carried_state(tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    model: dict[int, tuple[str, int]] = {}
    assert _apply(sink, model, random.Random(1), 1)
    version = sink.open(TABLE).version()
    assert sink.apply_changes(TABLE, _rows({1: ("again", 1)}), pa.table({"id": pa.array([], pa.int64())}),
                              ["id"], APP, 1) is False  # fmt: skip
    assert sink.open(TABLE).version() == version
    assert _read(sink) == model


def test_a_replay_is_recognised_when_another_process_applied_it(tmp_path: Path) -> None:
    """Two sinks (two processes of the same stream, one replaying): the second's carried state says
    not applied, its commit meets the first's entry, and the re-read table records the batch."""
    first, second = _sink(tmp_path), DeltaSink(str(tmp_path / "lake"), rewrite_below_bytes=1 << 30)
    model: dict[int, tuple[str, int]] = {}
    assert _apply(first, model, random.Random(5), 1)
    assert _apply(second, dict(model), random.Random(6), 2)  # second now carries state at this version
    assert _apply(first, model, random.Random(6), 2) is False  # stale state: conflict, re-read, skipped
    assert second.table_states.get(second.table_uri(TABLE)) is not None


def test_checkpoints_are_made_at_the_interval(tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    sink.open(TABLE).alter.set_table_properties({"delta.checkpointInterval": "5"})
    model: dict[int, tuple[str, int]] = {}
    rng = random.Random(9)
    for version in range(1, 13):
        _apply(sink, model, rng, version)
    log_dir = Path(sink.table_uri(TABLE)) / "_delta_log"
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log_dir.glob("*.checkpoint.parquet"))
    assert checkpoints == [5, 10]
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 10
    fresh = DeltaTable(sink.table_uri(TABLE))  # loads from the checkpoint
    assert fresh.transaction_version(APP) == 12
    assert _read(sink) == model


def test_tables_whose_protocol_asks_more_are_committed_by_delta_rs(tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    dt = sink.open(TABLE)
    assert unsupported_reason(dt) is None
    dt.alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    assert unsupported_reason(sink.open(TABLE)) in ("writer version 4", "delta.enableChangeDataFeed")
    model: dict[int, tuple[str, int]] = {}
    rng = random.Random(2)
    for version in range(1, 4):
        assert _apply(sink, model, rng, version)
    assert _read(sink) == model
    assert not [e for e in _log_entries(sink) if e["lines"][0]["commitInfo"].get("clientVersion") == CLIENT]


def test_an_existing_log_entry_is_never_replaced(tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    uri = sink.table_uri(TABLE)
    entry = Path(uri) / "_delta_log" / f"{1:020d}.json"
    commit_actions(LOCAL, uri, 0, [], app_transaction=("a", 1))
    before = entry.read_bytes()
    with pytest.raises(LogConflict):
        commit_actions(LOCAL, uri, 0, [], app_transaction=("b", 1))
    assert entry.read_bytes() == before
    assert [n for n in os.listdir(entry.parent) if n.endswith(".tmp")] == []
    assert sink.open(TABLE).transaction_version("a") == 1 and sink.open(TABLE).transaction_version("b") is None


# ------------------------------------------------------------------ disk: the whole rewrite's budget
class _Clock:
    """The grace of superseded files passes when the test says so, not with the wall clock."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _marking_sink(tmp_path: Path, grace: float = 60) -> tuple[DeltaSink, _Clock]:
    sink = DeltaSink(str(tmp_path / "lake"), rewrite_below_bytes=1 << 30, deletion_vectors=True,
                     small_table_retention_seconds=grace)  # fmt: skip
    clock = _Clock()
    assert sink.superseded is not None
    sink.superseded.clock = clock
    sink.prepare_table(TABLE, SCHEMA, ["id"])
    write_deltalake(sink.open(TABLE), _rows({k: (f"s{k}", k) for k in range(300)}), mode="append")  # the snapshot
    return sink, clock


def _details(sink: DeltaSink) -> list[dict]:
    """The ``mysqlcdc`` commit details of the stream's direct commits, in order."""
    return [json.loads(e["lines"][0]["commitInfo"]["mysqlcdc"]) for e in _log_entries(sink)
            if e["lines"][0]["commitInfo"].get("clientVersion") == CLIENT]  # fmt: skip


def _on_disk(sink: DeltaSink, suffix: str) -> set[str]:
    root = Path(sink.table_uri(TABLE))
    return {str(p.relative_to(root)) for p in root.rglob(f"*{suffix}") if "_delta_log" not in p.parts}


def _live(sink: DeltaSink) -> tuple[set[str], set[str]]:
    """The live data files and the vector files they refer to, as the log says."""
    from airflow_provider_mysqlcdc.sinks.delta_log_replay import replay
    from airflow_provider_mysqlcdc.sinks.delta_small_marks import vector_files_of

    adds = replay(LOCAL, sink.table_uri(TABLE)).adds
    return set(adds), set(vector_files_of(adds))


def _added_rows(sink: DeltaSink) -> list[int]:
    """Per direct commit: the rows of the new data files it added (not a file re-added with a vector)."""
    out = []
    for e in _log_entries(sink):
        if e["lines"][0]["commitInfo"].get("clientVersion") != CLIENT:
            continue
        adds = [line["add"] for line in e["lines"] if "add" in line and "deletionVector" not in line["add"]]
        out.append(sum(json.loads(a["stats"])["numRecords"] for a in adds))
    return out


def test_a_table_changed_within_its_grace_marks_rows_and_superseded_files_go_after_it(tmp_path: Path) -> None:
    """The bound's mechanism: a small table is rewritten whole only when no copy an earlier rewrite
    superseded is still within its grace; the batches in between write only their own rows (and mark
    the changed ones deleted); superseded files are deleted once their grace has passed, and not
    before — a reader holding an older version reads it all along."""
    sink, clock = _marking_sink(tmp_path)
    model = {k: (f"s{k}", k) for k in range(300)}
    rng = random.Random(12)
    assert _apply(sink, model, rng, 1)  # nothing superseded yet: the table is rewritten whole as one file
    for version in range(2, 12):
        clock.t += 1
        assert _apply(sink, model, rng, version)
        assert _read(sink) == model, f"table differs from the model after batch {version}"
    details = _details(sink)
    assert [d["small_table_rewrite"] for d in details] == [True] + [False] * 10  # the rest marked rows
    assert all(d["marked_rows"] > 0 for d in details[1:] if d["upserts"] > 0)
    # a marking batch writes its own upserts only; the whole rewrite wrote the table
    assert _added_rows(sink)[1:] == [d["upserts"] for d in details[1:]] and _added_rows(sink)[0] > 250
    assert _snapshot_files(sink), "the snapshot's file, superseded by batch 1, is kept for its grace"
    held, held_rows = sink.open(TABLE).version(), dict(model)

    clock.t += 60  # batch 1's superseded copy is past its grace: the table is rewritten whole again
    assert _apply(sink, model, rng, 12)
    assert _details(sink)[-1]["small_table_rewrite"] is True and _read(sink) == model
    rewritten, vectors = _live(sink)
    assert len(rewritten) == 1 and not vectors
    assert not _snapshot_files(sink), "deleted by batch 12's commit: its grace had passed"
    assert _read_version(sink, held) == held_rows  # every file of the older version is still there

    clock.t += 61  # what batch 12 superseded is past its grace now: batch 13's commit deletes it
    assert _apply(sink, model, rng, 13)
    live, vectors = _live(sink)
    assert _on_disk(sink, ".parquet") == live | rewritten  # batch 13 superseded batch 12's file: kept for now
    assert _on_disk(sink, ".bin") == vectors == set()  # every vector file was superseded by batch 12
    assert _read(sink) == model and sink.open(TABLE).transaction_version(APP) == 13
    with pytest.raises(Exception):  # noqa: B017 - time travel reaches back one grace (documented)
        _read_version(sink, held)


def test_files_of_a_table_no_batch_commits_to_go_when_the_grace_has_passed(tmp_path: Path) -> None:
    """A table the writer stopped changing: the stream deletes its superseded files between batches."""
    from airflow_provider_mysqlcdc.sinks.delta_small_table import sweep_superseded

    sink, clock = _marking_sink(tmp_path, grace=30)
    model = {k: (f"s{k}", k) for k in range(300)}
    assert _apply(sink, model, random.Random(4), 1)
    assert _snapshot_files(sink) and sweep_superseded(sink) == 0  # within its grace
    clock.t += 31
    assert sweep_superseded(sink) == 1 and not _snapshot_files(sink)
    assert _on_disk(sink, ".parquet") == _live(sink)[0] and _read(sink) == model


def _snapshot_files(sink: DeltaSink) -> set[str]:
    return {p for p in _on_disk(sink, ".parquet") if not p.startswith("stream/")}


def _read_version(sink: DeltaSink, version: int) -> dict[int, tuple[str, int]]:
    dt = DeltaTable(sink.table_uri(TABLE), version=version)
    got = pa.table(QueryBuilder().register("t", dt).execute("SELECT id, name, qty FROM t").read_all()).to_pylist()
    return {r["id"]: (r["name"], r["qty"]) for r in got}


def test_a_batch_that_loses_its_commit_leaves_no_file_behind(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Another writer's commit lands between two batches (a maintenance round's property set, an
    append): the batch's entry then loses the race. One that touched none of the table's files is
    caught up with and the same actions committed after it; otherwise the batch is planned again from
    the table as it is — and the losing plan's files, which no version refers to and no vacuum would
    ever find, are deleted at once (issue 33: such files grew the lake under load)."""
    import logging

    sink, clock = _marking_sink(tmp_path)
    other = DeltaSink(str(tmp_path / "lake"))
    model = {k: (f"s{k}", k) for k in range(300)}
    rng = random.Random(21)
    reread = []
    for version in range(1, 19):
        clock.t += 25  # whole rewrites and marking batches both lose races
        caplog.clear()
        if version % 3 == 0:  # touches no file: the batch is committed after it without reading anew
            other.open(TABLE).alter.set_table_properties({"delta.checkpointInterval": str(100 + version)})
        if version % 4 == 0:  # adds a file: the batch is planned again
            write_deltalake(other.open(TABLE), _rows({10_000 + version: ("other", version)}), mode="append")
            model[10_000 + version] = ("other", version)
        with caplog.at_level(logging.INFO, logger="airflow_provider_mysqlcdc.sinks.delta_small_table"):
            assert _apply(sink, model, rng, version)
        if any("reading the table again" in r.getMessage() for r in caplog.records):
            reread.append(version)
        assert _read(sink) == model, f"table differs from the model after batch {version}"
    assert reread == [4, 8, 12, 16], reread  # 3, 6, 9, 15: caught up with the property set
    ever_added = {line["add"]["path"] for e in _log_entries(sink) for line in e["lines"] if "add" in line}
    ever_vectors = {line["add"]["deletionVector"]["pathOrInlineDv"] for e in _log_entries(sink)
                    for line in e["lines"] if "add" in line and line["add"].get("deletionVector")}  # fmt: skip
    assert _on_disk(sink, ".parquet") <= ever_added, _on_disk(sink, ".parquet") - ever_added
    assert len(_on_disk(sink, ".bin")) <= len(ever_vectors)
