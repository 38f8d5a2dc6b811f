"""The lake and the pipeline state on an object store (an S3 server on 127.0.0.1), under a random writer.

Spark's JVM has no S3 connector here (pyspark ships none), so these tests prove that nothing of
the pipeline needs one: both chunk readers stage through Python, Delta commits go through
delta-rs (S3 conditional writes), the stream's staged blocks, manifest and control documents go
through fsspec, and its checkpoint is copied into the store at each batch boundary — a stream
restarted with an empty local disk resumes exactly where the store says.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import SnapshotOptions, run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.storage import PROBE_PREFIX, LakeStorage, root_problem
from airflow_provider_mysqlcdc.stream.control import checkpoint_dir, checkpoint_offset
from airflow_provider_mysqlcdc.stream.job import (
    StreamOptions,
    checkpoint_copy,
    start_stream,
    stop_gracefully,
    wait_until_caught_up,
)
from tests.support.mariadb import free_port
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.verify import compare

ROWS = 8_000
CHUNK = 1_000


def _assert_equal(settings: Any, plan: Any, sink: DeltaSink, tables: list[str]) -> None:
    with settings.connect() as conn:
        for t in tables:
            cmp = compare(conn, plan.tables[t], sink.read(t))
            assert cmp.match, f"{t}: {cmp.first_difference}"


def _local_files(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file()]


def test_the_plans_write_probe_on_s3(s3_server) -> None:  # type: ignore[no-untyped-def]
    """The plan's check of an object-store root: a writable one passes and keeps nothing; a missing
    bucket and an unreachable endpoint fail at once, naming the root, the error and the fix."""
    storage = LakeStorage(s3_server.storage_options())
    root = s3_server.url("probe-lake")
    assert root_problem(storage, "sink_root", root) is None
    assert not [k for k in storage.listdir(root) if k.startswith(PROBE_PREFIX)]
    no_bucket = root.replace(f"s3://{s3_server.endpoint.bucket}/", "s3://no-such-bucket-mysqlcdc/")
    msg = root_problem(storage, "state_root", no_bucket)
    assert msg is not None and msg.startswith(f"state_root {no_bucket!r} is not writable (")
    assert "Fix: check that the bucket exists and is reachable" in msg
    unreachable = LakeStorage({**s3_server.storage_options(), "aws_endpoint_url": f"http://127.0.0.1:{free_port()}"})
    msg = root_problem(unreachable, "sink_root", root)
    assert msg is not None and "Could not connect to the endpoint URL" in msg and "storage_conn_id" in msg


def test_snapshot_and_stream_with_lake_and_state_on_s3(mariadb, db, cdc_settings, spark, s3_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tables = make_tables(mariadb, db, rows=ROWS)
    storage = LakeStorage(s3_server.storage_options())
    store = StateStore(s3_server.url("state"), "s3", storage)
    sink = DeltaSink(s3_server.url("lake"), storage, owner="s3")
    scratch = tmp_path / "scratch"
    writer = RandomWriter(mariadb, db)
    writer.start()
    try:
        with cdc_settings.connect() as conn:
            plan = plan_snapshot(conn, tables, CHUNK, 8)
        store.write_plan("p1", plan.to_dict())
        assert len(plan.groups) >= 2
        for g in plan.groups:  # both readers: Spark JDBC (written from Python) and the native reader
            reader = "jdbc" if g.group_id % 2 == 0 else "native"
            run_snapshot_group(spark, cdc_settings, store, "p1", g.group_id, sink,
                               SnapshotOptions(reader=reader, scratch_dir=str(scratch)))  # fmt: skip
        store.write_manifest(build_manifest(plan, store.read_all_results("p1")))
        # max_inline_bytes=0: every change block is staged in the state store, not sent through Spark
        opts = StreamOptions(trigger_seconds=0.5, readers=2, max_inline_bytes=0, scratch_dir=str(scratch))
        # the checkpoint's local copy, pushed into the store when the query stops, as run_stream does
        # (a stream that caught up in one batch has no later batch to push that batch's commit)
        checkpoint = checkpoint_copy(store, opts)
        assert checkpoint is not None
        query = start_stream(spark, cdc_settings, store, sink, opts, checkpoint)
        try:
            time.sleep(6)
            writer.stop_event.set()
            writer.join()
            with cdc_settings.connect() as conn:
                target = current_offset(conn)
            wait_until_caught_up(query, target, timeout=240)
        finally:
            stop_gracefully(query, timeout=60)
            checkpoint.push()
            checkpoint.close()
    finally:
        writer.stop_event.set()
        writer.join()
    assert writer.transactions > 100, "the writer made too few changes for the test to mean anything"
    _assert_equal(cdc_settings, plan, sink, tables)

    fs = s3_server.fsspec()
    for t in tables:  # the lake is on the object store, every table a Delta table there
        db_name, name = t.split(".")
        assert fs.ls(s3_server.url(f"lake/{db_name}/{name}/_delta_log")), t
    ckpt = checkpoint_dir(store)
    assert store.list(f"{ckpt}/offsets"), "the checkpoint's offsets were not copied into the state store"
    assert not [f for f in _local_files(tmp_path) if f.endswith(".parquet")], "data files were written locally"

    # A restarted stream with nothing on the local disk resumes from the store's checkpoint copy.
    for p in _local_files(scratch):
        os.remove(p)
    resumed_from = checkpoint_offset(store)
    assert resumed_from is not None
    mariadb.execute(*[f"DELETE FROM {t} LIMIT 25" for t in tables])
    query = start_stream(spark, cdc_settings, store, sink, opts)
    try:
        with cdc_settings.connect() as conn:
            target = current_offset(conn)
        wait_until_caught_up(query, target, timeout=240)
    finally:
        stop_gracefully(query, timeout=60)
    _assert_equal(cdc_settings, plan, sink, tables)


@pytest.mark.parametrize("reader", ["jdbc", "native"])
def test_retried_group_on_s3_replaces_its_files(mariadb, db, cdc_settings, spark, s3_server, reader) -> None:  # type: ignore[no-untyped-def]
    """A group run twice (an Airflow retry) leaves exactly one copy of its rows: the second commit
    removes the first attempt's files, and the staging directory holds no stray file."""
    tables = make_tables(mariadb, db, rows=3_000)[:1]
    storage = LakeStorage(s3_server.storage_options())
    store = StateStore(s3_server.url(f"state-{reader}"), "retry", storage)
    sink = DeltaSink(s3_server.url(f"lake-{reader}"), storage)
    with cdc_settings.connect() as conn:
        plan = plan_snapshot(conn, tables, 1_000, 8)
    store.write_plan("p1", plan.to_dict())
    for _ in range(2):
        for g in plan.groups:
            run_snapshot_group(spark, cdc_settings, store, "p1", g.group_id, sink, SnapshotOptions(reader=reader))
    _assert_equal(cdc_settings, plan, sink, tables)
    dt = sink.open(tables[0])
    assert len(dt.file_uris()) == len([s for s in plan.splits if s.table == tables[0]])


def test_two_groups_commit_to_one_delta_table_on_s3_at_the_same_moment(s3_server) -> None:  # type: ignore[no-untyped-def]
    """Parallel snapshot groups commit to one table at once: S3 conditional writes make one commit of
    each version win; the loser re-reads and retries, so both groups' files are in the table."""
    import threading

    import pyarrow as pa

    from airflow_provider_mysqlcdc.core.records import StagedFile

    storage = LakeStorage(s3_server.storage_options())
    sink = DeltaSink(s3_server.url("lake-concurrent"), storage)
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    table = "db.t"
    sink.prepare_table(table, schema, ["id"])
    groups = {}
    for g in range(4):  # four groups, two chunks each
        files = []
        for c in range(2):
            ids = list(range(g * 1000 + c * 100, g * 1000 + c * 100 + 50))
            path = f"{sink.staging_location(table, f'g{g}', 'a1')}/part-{c}.parquet"
            size = storage.write_parquet(pa.table({"id": ids, "v": [f"g{g}"] * len(ids)}, schema=schema), path)
            files.append(StagedFile(path, len(ids), size, [g * 10 + c]))
        groups[g] = files
    barrier = threading.Barrier(len(groups))
    versions: dict[int, int] = {}
    errors: list[BaseException] = []

    def commit(g: int) -> None:
        try:
            barrier.wait()
            versions[g] = sink.commit_snapshot_group(table, f"g{g}", groups[g], schema, {"group": g})
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(versions.values()) == list(range(min(versions.values()), min(versions.values()) + len(groups)))
    got = sink.read(table)
    assert got.num_rows == 4 * 2 * 50 and len(set(got.column("id").to_pylist())) == got.num_rows
    assert sorted(set(got.column("v").to_pylist())) == ["g0", "g1", "g2", "g3"]
    log = sorted(p.rsplit("/", 1)[-1] for p in s3_server.fsspec().ls(s3_server.url("lake-concurrent/db/t/_delta_log")))
    numbers = [int(n.split(".")[0]) for n in log if n.endswith(".json")]
    assert numbers == list(range(len(numbers))), f"the Delta log has a gap: {log}"

def test_state_documents_read_while_rewritten(s3_server) -> None:  # type: ignore[no-untyped-def]
    """A control document read while its writer replaces it (the stream's run record, every few
    seconds) reads whole, old or new: s3fs' file objects pin the ETag seen at open and failed the
    read with FileExpired (found by test_production_deployment: a hand-over's pause read run.json)."""
    import threading

    store = StateStore(s3_server.url("state-race"), "race", LakeStorage(s3_server.storage_options()))
    store.write_json("stream/run.json", {"n": 0, "pad": "x" * 2000})
    stop = threading.Event()

    def rewrite() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            store.write_json("stream/run.json", {"n": n, "pad": "x" * 2000})

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        seen = {store.read_json("stream/run.json")["n"] for _ in range(150)}
    finally:
        stop.set()
        writer.join()
    assert len(seen) > 1  # the reads really raced the writes


def test_small_table_batches_commit_directly_on_s3(s3_server) -> None:  # type: ignore[no-untyped-def]
    """The stream's direct log commits (sinks/delta_log.py) on S3: each entry is created with
    ``If-None-Match``, so another writer's commit between two batches makes the stream read the
    table again instead of replacing that entry, and an existing entry is never overwritten."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from airflow_provider_mysqlcdc.sinks.delta_log import CLIENT, LogConflict, commit_actions

    storage = LakeStorage(s3_server.storage_options())
    root = s3_server.url("lake-direct")
    sink = DeltaSink(root, storage, rewrite_below_bytes=1 << 30)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    table = "db.small"
    sink.prepare_table(table, schema, ["id"])
    model: dict[int, str] = {}
    no_deletes = pa.table({"id": pa.array([], pa.int64())})
    for version in range(1, 7):
        ups = {k: f"b{version}" for k in range(version * 3, version * 3 + 5)}
        model.update(ups)
        rows = pa.table({"id": list(ups), "v": list(ups.values())}, schema=schema)
        assert sink.apply_changes(table, rows, no_deletes, ["id"], "app", version)
        if version == 3:  # another writer between two batches
            extra = pa.table({"id": [999], "v": ["other"]}, schema=schema)
            write_deltalake(DeltaSink(root, storage).open(table), extra, mode="append",
                            storage_options=sink.storage_options)  # fmt: skip
            model[999] = "other"
    got = {r["id"]: r["v"] for r in sink.read(table).to_pylist()}
    assert got == model
    fs = s3_server.fsspec()
    log_dir = s3_server.url("lake-direct/db/small/_delta_log")
    infos = [json.loads(fs.cat(p).decode().splitlines()[0])["commitInfo"] for p in sorted(fs.ls(log_dir))
             if p.endswith(".json")]  # fmt: skip
    assert sum(1 for i in infos if i.get("clientVersion") == CLIENT) == 6
    latest = sink.open(table).version()
    before = fs.cat(f"{log_dir}/{latest:020d}.json")
    with pytest.raises(LogConflict):
        commit_actions(storage, sink.table_uri(table), latest - 1, [], app_transaction=("intruder", 1))
    assert fs.cat(f"{log_dir}/{latest:020d}.json") == before
    assert sink.open(table).transaction_version("intruder") is None


def test_big_table_batches_take_deletion_vectors_on_s3(s3_server) -> None:  # type: ignore[no-untyped-def]
    """Deletion vectors on S3 (sinks/delta_dv_table.py): the vector files, the direct commits, a
    second sink indexing the table from the bucket, and maintenance's vacuum of vector files."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy, maintain_table

    storage = LakeStorage(s3_server.storage_options())
    root = s3_server.url("lake-dv")
    sink = DeltaSink(root, storage, deletion_vectors=True)  # rewrite_below_bytes 0: every table is big
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    table = "db.big"
    sink.prepare_table(table, schema, ["id"])
    model = {k: "s" for k in range(4000)}
    for lo in range(0, 4000, 1000):
        part = pa.table({"id": list(range(lo, lo + 1000)), "v": ["s"] * 1000}, schema=schema)
        write_deltalake(sink.open(table), part, mode="append", storage_options=sink.storage_options)
    for version in range(1, 6):
        ups = {k: f"b{version}" for k in range(version * 500, version * 500 + 50)} | {10_000 + version: "new"}
        gone = [version * 7, version * 700 + 1]
        model.update(ups)
        for k in gone:
            model.pop(k, None)
        rows = pa.table({"id": list(ups), "v": list(ups.values())}, schema=schema)
        use = sink if version < 4 else DeltaSink(root, storage, deletion_vectors=True)  # a restarted stream
        assert use.apply_changes(table, rows, pa.table({"id": pa.array(gone, pa.int64())}), ["id"], "app", version)
        assert {r["id"]: r["v"] for r in sink.read(table).to_pylist()} == model
    assert "deletionVectors" in (sink.open(table).protocol().reader_features or [])
    fs = s3_server.fsspec()
    vectors = [p for p in fs.ls(s3_server.url("lake-dv/db/big")) if "deletion_vector_" in p]
    assert len(vectors) == 5
    result = maintain_table(sink, table, MaintenancePolicy(retention_hours=0, log_retention_hours=0), orphans=True)
    assert result.vacuumed_files >= 1
    assert {r["id"]: r["v"] for r in DeltaSink(root, storage).read(table).to_pylist()} == model
