"""A changelog through re-reads on a REAL pipeline: a repair, a re-snapshot and a partial backfill
while a writer with key moves runs and the stream runs on.

Three tables with changelogs and metadata columns are captured and streamed (in this process, as
the stream job runs it: hand-overs pause and resume it). Rows are then removed at the source with no
binlog event (``sql_log_bin=0``, as a cascading foreign key or a restore would), and the pipeline
re-reads: a repair of the chunks holding them (t_int, t_comp), a re-snapshot (t_ci), a partial
backfill (t_int). Each re-read makes the stream replay behind its checkpoint. Then, per table:

* the changelog's binlog changes (ops c/u/d) equal, in binlog order and exactly once, an
  independent read of the binlog since the first snapshot (python-mysql-replication's own
  decoding) passed through the first snapshot's handoff rule — no re-read logs a change twice;
* the re-reads' rows are op ``r`` rows at their group's HW, and each row the source lost without a
  binlog event is an op ``d`` with ``_tx_id`` ``snapshot:<plan>:removed`` (none for a row the
  source still has);
* the SCD type 2 view's current rows equal the source, and so does the mirror; every mirror row's
  metadata columns are those of its current version in the changelog; ``verify`` passes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from airflow_provider_mysqlcdc.core.changelog import order_key
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import read_changelog
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import request_stop
from airflow_provider_mysqlcdc.verify import verify_pipeline
from tests.support.binlog_changes import binlog_changes
from tests.support.changelog_checks import assert_changes_are_the_binlog_s, assert_history_is_the_source
from tests.support.mariadb import MariaDBServer
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.stream_thread import StreamThread

pytestmark = pytest.mark.integration

ROWS = 3_000
PIPELINE = "rr"
KEYS = {"t_int": ["id"], "t_comp": ["region", "n"], "t_ci": ["k"]}


def _image(row: dict[str, Any] | None, table: str) -> tuple[Any, ...] | None:
    return None if row is None else (*(row[c] for c in KEYS[table]), row["v"])


def _remove_silently(mariadb: MariaDBServer, db: str, table: str, where: str) -> list[tuple[Any, ...]]:
    """Delete rows with no binlog event (as a cascading foreign key or a restore would); their keys."""
    key = ", ".join(KEYS[table])
    gone = mariadb.query(f"SELECT {key} FROM `{db}`.{table} WHERE {where}")
    mariadb.execute("SET SESSION sql_log_bin = 0", f"DELETE FROM `{db}`.{table} WHERE {where}")
    assert gone, f"{table}: no row matches {where}"
    return [tuple(r) for r in gone]


def _run(spark: Any, settings: Any, store: StateStore, sink: DeltaSink, plan_id: str, **params: Any) -> Any:
    """One pipeline run as the DAG makes it: plan, every snapshot group, finalize."""
    config = PipelineConfig.from_params(pipeline_id=PIPELINE, sink_root=sink.root, state_root=store.state_root,
                                        chunk_size=300, chunks_per_task=4, metadata_columns=True,
                                        **params)  # fmt: skip
    with settings.connect() as conn:
        outcome = plan_run(conn, store, config, plan_id, sink.exists, table_owner=sink.owner_of)
    highs = {}
    for g in outcome.groups:
        highs[g["group_id"]] = run_snapshot_group(spark, settings, store, plan_id, g["group_id"], sink).high_watermark
    return outcome, highs, finalize_run(store, sink, plan_id, stop_timeout=120, settings=settings)


@pytest.mark.timeout(900)
def test_repair_resnapshot_and_partial_backfill_keep_the_changelog_exact(  # type: ignore[no-untyped-def]
    mariadb: MariaDBServer, db: str, cdc_settings, spark, tmp_path: Path
) -> None:
    tables = make_tables(mariadb, db, rows=ROWS)
    t_int, t_comp, t_ci = tables
    store = StateStore(str(tmp_path / "state"), PIPELINE)
    sink = DeltaSink(str(tmp_path / "lake"), owner=PIPELINE)
    common = {"tables": tables, "changelog_tables": [f"{db}.t_*"]}
    writer = RandomWriter(mariadb, db, rate=100, seed=33, rows=ROWS)
    writer.start()
    stream = None
    try:
        _, first_highs, _ = _run(spark, cdc_settings, store, sink, "p1", **common)
        first = store.read_manifest()
        stream = StreamThread(spark, cdc_settings, store, sink, "rr-stream").start_running()
        stream.wait_applied(cdc_settings)

        # rows the source loses with no binlog event, in the chunks of two tables
        gone = {t_int: _remove_silently(mariadb, db, "t_int", "id BETWEEN 700 AND 704"),
                t_comp: _remove_silently(mariadb, db, "t_comp", "n BETWEEN 1500 AND 1503")}  # fmt: skip
        repairs: dict[str, list[int]] = {}
        for t, keys in gone.items():
            entry = first.tables[t]
            locator = ChunkLocator([c.chunk for c in entry.chunks], first.collations)
            cols = entry.chunk_key_columns
            ids = {locator.locate([k[KEYS[t.split(".")[1]].index(c)] for c in cols]).split_id for k in keys}
            repairs[t] = sorted(ids)
        _, repair_highs, out = _run(spark, cdc_settings, store, sink, "r2", repair_chunks=repairs, **common)
        assert out.repaired == repairs and out.reloaded, out

        gone[t_ci] = _remove_silently(mariadb, db, "t_ci", "k IN ('key000101', 'KEY000102', 'key000103')")
        _, resnap_highs, out = _run(spark, cdc_settings, store, sink, "r3", resnapshot_tables=[t_ci], **common)
        assert out.resnapshotted == [t_ci], out

        _, _, out = _run(spark, cdc_settings, store, sink, "r4", snapshot_filters={t_int: "v % 7 = 0"}, **common)
        assert t_int in out.repaired, out
        generations = store.read_manifest().generation.number
        time.sleep(2)
        writer.stop_event.set()
        writer.join()
        stream.wait_applied(cdc_settings)
        with cdc_settings.connect() as conn:
            end = current_offset(conn)
        request_stop(store, timeout=120)
        stream.stop_event.set()
        stream.join(timeout=120)
        assert stream.error is None, stream.error
    finally:
        writer.stop_event.set()
        if stream is not None and stream.is_alive():
            request_stop(store, timeout=60)
            stream.stop_event.set()
            stream.join(timeout=120)
    assert not writer.errors, writer.errors[:3]
    assert generations > first.generation.number, "no re-read made the stream replay behind its checkpoint"

    flt = first.handoff_filter()
    independent = binlog_changes(mariadb, db, first.start_offset, BinlogOffset(end.file, end.pos))
    with cdc_settings.connect() as conn:
        for t in tables:
            name = t.split(".")[1]
            log = order_key(read_changelog(sink, t))
            tx = log.column("_tx_id")
            reads = log.filter(pc.starts_with(tx, "snapshot:"))
            changes = log.filter(pc.invert(pc.starts_with(tx, "snapshot:")))

            # binlog changes: exactly the independent read through the first snapshot's rule, each once
            assert_changes_are_the_binlog_s(t, changes, independent, flt, first.tables[t].chunk_key_columns,
                                            lambda row, name=name: _image(row, name))  # fmt: skip

            # the re-reads: op r at their group's HW; op d for exactly the rows gone without a binlog event
            hw_of = {f"snapshot:p1:{g}": hw for g, hw in first_highs.items()}
            hw_of.update({f"snapshot:r2:{g}": hw for g, hw in repair_highs.items()})
            hw_of.update({f"snapshot:r3:{g}": hw for g, hw in resnap_highs.items()})
            for r in reads.filter(pc.equal(reads.column("_op"), "r")).to_pylist():
                if r["_tx_id"] in hw_of:
                    assert BinlogOffset(r["_binlog_file"], r["_binlog_pos"]) == hw_of[r["_tx_id"]], r
            removed = reads.filter(pc.equal(reads.column("_op"), "d")).to_pylist()
            removed_keys = {tuple(r["before"][c] for c in KEYS[name]) for r in removed}
            assert removed_keys <= set(gone.get(t, [])), (t, removed_keys, gone.get(t))
            if t in gone:  # a planted row the writer happened to write again is the binlog's
                assert removed_keys, f"{t}: no row gone without a binlog event was logged as removed"
                plan = "r3" if t == t_ci else "r2"
                assert {r["_tx_id"] for r in removed} == {f"snapshot:{plan}:removed"}, removed[:2]

            # the SCD2 view's current rows and the mirror equal the source, with the metadata of its history
            schema = read_table_schema(conn, TableId.parse(t))
            assert_history_is_the_source(conn, sink, t, schema, first.tables[t].merge_key)
    report = verify_pipeline(cdc_settings, store, sink, wait_timeout=120)
    assert report.ok, report.to_dict()
