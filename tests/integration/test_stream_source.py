"""The ``mysql_binlog`` streaming source on a real MariaDB and a real Spark (local[2]).

What is proven here (docs/architecture.md, "The handoff", "Binlog decoding", "Invariants"):

* the per-chunk, per-image HW filter emits exactly the allowed changes, including a transaction that
  starts exactly at a HW (emitted) and one that ends there (not emitted), and updates that move a
  key between chunks with different HWs (only the passing half);
* splitting a micro-batch into parallel decoders changes nothing: same rows, same order, across
  binlog rotations inside the batch; every cut is a transaction boundary;
* ``max_events_per_trigger`` caps batches at transaction boundaries; restarting from a checkpoint,
  also after a stop in the middle of the backlog, neither loses nor repeats a change;
* a purged start offset fails the query with the re-snapshot message; an idle source still moves
  its offset when other tables are written, so a quiet table is not stranded on a purged file;
* a server restart under a running read (and under the driver's planning) is waited for, and the
  interrupted transaction's rows are not produced twice.

How queries are driven (what worked with Spark 4.2): ``trigger(availableNow=True)`` +
``awaitTermination()``. The source implements ``SupportsTriggerAvailableNow``, so Spark runs as many
capped batches as needed to reach the binlog position seen at start and then stops — a
deterministic "run until caught up". ``processingTime`` + ``stop()`` is used where a query must be
interrupted mid-backlog. ``foreachBatch`` collects rows per batch id: a batch replayed after a stop
must come back identical, and the union over batch ids is what a sink idempotent per batch sees.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Spark's Python workers and planner must be this interpreter (it has pyarrow and the package);
# the session fixture starts the JVM after collection, so setting it at import is early enough.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa
import pytest

from airflow_provider_mysqlcdc.core.chunk import ChunkGroup, SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import KeyColumn
from airflow_provider_mysqlcdc.core.manifest import Manifest, ManifestError
from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_file_number
from airflow_provider_mysqlcdc.core.records import ChunkResult
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql import binlog_values
from airflow_provider_mysqlcdc.mysql.binlog_ranges import BinlogBoundaries, RangeSlice, capped_end, slice_range
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import binlog_files, current_offset
from airflow_provider_mysqlcdc.stream.partition_read import SCHEMA, SEQ_SHIFT, expand_changes
from airflow_provider_mysqlcdc.stream.spark_source import register
from tests.support.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# One tuple per change (expand_changes of the source's change blocks), images as dicts.
COLS = ["op", "tbl", "before", "after", "file", "pos", "file_num", "event_pos", "row_index", "seq", "commit_ts"]
OP, TBL, BEFORE, AFTER, FILE, POS, FILE_NUM, EVENT_POS, ROW_INDEX, SEQ, COMMIT_TS = range(len(COLS))
QUERY_TIMEOUT = 180
_ids = itertools.count(7400)  # distinct replication server_ids for this module's readers


# ---------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def binlog_spark(spark):  # type: ignore[no-untyped-def]
    register(spark)
    return spark


# ---------------------------------------------------------------------------------------- helpers
def write_manifest(
    conn: Any,
    path: Path,
    chunks: dict[str, list[tuple[int | None, int | None, BinlogOffset]]],
) -> dict[str, Any]:
    """Manifest through the real writer: plan dict (INT chunk key ``id``) + one result per chunk."""
    tables, splits, results = {}, [], []
    for table, spec in chunks.items():
        tables[table] = read_table_schema(conn, TableId.parse(table)).to_dict()
        for i, (lo, hi, hw) in enumerate(spec):
            splits.append(
                SnapshotChunk(table, i, (KeyColumn("id", "int"),), None if lo is None else (lo,),
                              None if hi is None else (hi,))
            )  # fmt: skip
            results.append(ChunkResult(table, i, 0, hw, hw, 0, 0.0))
    plan = {"tables": tables, "groups": [ChunkGroup(0, splits).to_dict()], "collations": {}}
    manifest = build_manifest(plan, results)
    path.write_text(manifest.to_json())
    return manifest.to_dict()


@dataclass
class Run:
    batches: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    progress: list[Any] = field(default_factory=list)

    def rows(self) -> list[tuple[Any, ...]]:
        return [r for b in sorted(self.batches) for r in self.batches[b]]

    def offsets(self) -> list[tuple[BinlogOffset | None, BinlogOffset]]:
        """(start, end) of every batch this run executed, from the query progress."""
        out = []
        for p in self.progress:
            if not p.numInputRows and p.sources[0].startOffset == p.sources[0].endOffset:
                continue
            s, e = p.sources[0].startOffset, p.sources[0].endOffset
            out.append((_offset(s), _offset(e)))
        return out


def _offset(x: Any) -> BinlogOffset | None:
    if x is None or x == "null":
        return None
    d = json.loads(x) if isinstance(x, str) else x
    return BinlogOffset.from_dict(d)


def run_query(
    spark: Any,
    settings: ConnectionSettings,
    manifest: Path,
    checkpoint: Path,
    options: dict[str, Any] | None = None,
    stop_after_batches: int | None = None,
) -> Run:
    """Run a query to completion (availableNow), or until ``stop_after_batches`` (processingTime)."""
    run = Run()
    options = {"before_image": "full", **(options or {})}  # full images: compared with direct_read

    def collect(df: Any, batch_id: int) -> None:
        rows = as_tuples(expand_changes(df.toArrow()))
        if batch_id in run.batches:  # a batch replayed after a restart must be the same batch
            assert [r[:SEQ] for r in run.batches[batch_id]] == [r[:SEQ] for r in rows]
        run.batches[batch_id] = rows

    reader = (
        spark.readStream.format("mysql_binlog")
        .option("source", json.dumps(settings.to_dict()))
        .option("manifest", str(manifest))
    )
    for k, v in options.items():
        reader = reader.option(k, str(v))
    writer = reader.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
    if stop_after_batches is None:
        query = writer.trigger(availableNow=True).start()
        try:
            assert query.awaitTermination(QUERY_TIMEOUT), "availableNow query did not finish"
        finally:
            run.progress = list(query.recentProgress)
    else:
        query = writer.trigger(processingTime="0 seconds").start()
        deadline = time.monotonic() + QUERY_TIMEOUT
        while len(run.batches) < stop_after_batches and query.isActive and time.monotonic() < deadline:
            time.sleep(0.05)
        query.stop()
        run.progress = list(query.recentProgress)
        assert query.exception() is None, query.exception()
        assert len(run.batches) >= stop_after_batches
    return run


def direct_read(
    settings: ConnectionSettings, manifest: dict[str, Any], start: BinlogOffset, end: BinlogOffset,
    piece: RangeSlice | None = None,
) -> list[tuple[Any, ...]]:
    """The reference: one sequential BinlogRangeReader, no Spark, no filter; rows without ``seq``.
    With ``piece``, only that slice of the range (its rows events window)."""
    conv = {t: binlog_values.binlog_row_converter(s) for t, s in Manifest.from_dict(manifest).schemas().items()}
    if piece is not None:
        start, end = piece.start, piece.end
    reader = BinlogRangeReader(settings, start, end, sorted(conv), next(_ids),
                               convert=lambda t, v, ns: conv[t](v, ns), emit_from=piece and piece.emit_from,
                               emit_to=piece and piece.emit_to)  # fmt: skip
    with reader:
        out = [
            (c.op, c.table, c.before, c.after, c.tx_offset.file, c.tx_offset.pos,
             c.event_pos[0], c.event_pos[1], c.row_index, c.commit_ts)
            for c in reader
        ]  # fmt: skip
    assert reader.reached_end
    return out


def as_tuples(changes: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(c[k] for k in COLS) for c in changes]


def no_seq(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [r[:SEQ] + r[SEQ + 1 :] for r in rows]


def ids(rows: list[tuple[Any, ...]], table: str) -> list[tuple[str, Any, Any]]:
    """(op, before id, after id) of the rows of ``table``, in order."""
    out = []
    for r in rows:
        if r[TBL] == table:
            b = r[BEFORE]["id"] if r[BEFORE] else None
            a = r[AFTER]["id"] if r[AFTER] else None
            out.append((r[OP], b, a))
    return out


def server_events(server: MariaDBServer, start: BinlogOffset, end: BinlogOffset) -> list[tuple[str, int, str, int]]:
    """(file, pos, type, end_pos) of the server's events in ``[start, end)`` (root: SHOW BINLOG EVENTS)."""
    out = []
    for f, *_ in server.query("SHOW BINARY LOGS"):
        n = binlog_file_number(f)
        if start.file_number <= n <= end.file_number:
            for r in server.query(f"SHOW BINLOG EVENTS IN '{f}'"):
                if BinlogOffset(f, int(r[1])) >= start and BinlogOffset(f, int(r[1])) < end:
                    out.append((f, int(r[1]), str(r[2]), int(r[4])))
    return out


def server_boundaries(events: list[tuple[str, int, str, int]], files: list[tuple[str, int]]) -> set[BinlogOffset]:
    """Where the server's own event list says a transaction starts or ends, plus every file start."""
    out = {BinlogOffset(f, p) for f, p, t, _ in events if t == "Gtid"}
    out |= {BinlogOffset(f, e) for f, _, t, e in events if t == "Xid"}
    return out | {BinlogOffset(f, 4) for f, _ in files}


def load_mixed(server: MariaDBServer, db: str, n: int, rotate_every: int = 0, first_id: int = 0) -> None:
    """Inserts, multi-row statements, updates, a multi-statement transaction and deletes on ``db``.t."""
    for i in range(n):
        k = first_id + i * 10
        server.execute(f"INSERT INTO `{db}`.t VALUES ({k}, 'v{k}', {k}.5)")
        if i % 3 == 0:
            server.execute(f"INSERT INTO `{db}`.t VALUES ({k + 1}, 'a', 1), ({k + 2}, 'b', 2), ({k + 3}, 'c', 3)")
        if i % 4 == 1:
            server.execute(f"UPDATE `{db}`.t SET v = CONCAT(v, '+') WHERE id BETWEEN {first_id} AND {k}")
        if i % 5 == 2:
            server.execute("BEGIN", f"UPDATE `{db}`.t SET id = {k + 5} WHERE id = {k}",
                           f"DELETE FROM `{db}`.t WHERE id = {k + 5}", "COMMIT")  # fmt: skip
        if rotate_every and i % rotate_every == rotate_every - 1:
            server.execute("FLUSH BINARY LOGS")


# ------------------------------------------------------------------------------- pure: manifest
def test_build_manifest_names_chunks_without_results() -> None:
    schema = {"table": "d.t", "columns": [], "primary_key": ["id"]}
    splits = [SnapshotChunk("d.t", i, (KeyColumn("id", "int"),), None if i == 0 else (i * 10,),
                            None if i == 2 else ((i + 1) * 10,)) for i in range(3)]  # fmt: skip
    groups = [ChunkGroup(0, splits[:2]).to_dict(), ChunkGroup(1, splits[2:]).to_dict()]
    plan = {"tables": {"d.t": schema}, "groups": groups}
    hw = BinlogOffset("mysql-bin.000002", 400)
    with pytest.raises(ManifestError, match=r"d\.t#1 \(group 0\), d\.t#2 \(group 1\).*groups to \(re\)run: \[0, 1\]"):
        build_manifest(plan, [ChunkResult("d.t", 0, 0, hw, hw, 1, 0.1)])
    # A retried chunk keeps its later HW; the start offset is the minimum over chunks.
    later = BinlogOffset("mysql-bin.000003", 4)
    m = build_manifest(plan, [ChunkResult("d.t", i, 0, hw, hw, 1, 0.1) for i in range(3)]
                       + [ChunkResult("d.t", 1, 0, hw, later, 1, 0.1)])  # fmt: skip
    assert m.start_offset == hw
    assert [c.high_watermark for c in m.tables["d.t"].chunks] == [hw, later, hw]
    assert m.to_dict()["tables"]["d.t"]["splits"][1]["high_watermark"] == later.to_dict()


# ------------------------------------------------------------------ boundaries against the server
def test_slices_cover_the_range_exactly_once_across_rotations(mariadb, db, cdc_settings, cdc_conn,
                                                              tmp_path) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(200), d DECIMAL(10,1))")
    start = current_offset(cdc_conn)
    manifest = write_manifest(cdc_conn, tmp_path / "m.json", {f"{db}.t": [(None, None, start)]})
    load_mixed(mariadb, db, 40, rotate_every=13)
    mariadb.execute(f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY)")  # DDL: a standalone transaction
    load_mixed(mariadb, db, 10, first_id=10_000)
    end = current_offset(cdc_conn)
    whole = direct_read(cdc_settings, manifest, start, end)
    assert len({r[FILE_NUM] for r in whole}) >= 4  # the range spans rotations
    bounds = BinlogBoundaries(cdc_conn)
    files = binlog_files(cdc_conn)
    sizes = dict(files)
    events = server_events(mariadb, start, end)
    boundaries = server_boundaries(events, files) | {start, end}
    rows_events = {BinlogOffset(f, p) for f, p, t, _ in events if t.startswith(("Write_rows", "Update_rows",
                                                                                "Delete_rows"))}  # fmt: skip

    def abs_pos(o: BinlogOffset) -> int:
        """Position counted over all files, to compare byte distances across rotations."""
        return sum(sizes[f] for f in sizes if binlog_file_number(f) < o.file_number) + o.pos

    for parts in (2, 3, 7, 50):
        slices = slice_range(bounds, files, start, end, parts, min_bytes=0)
        assert 2 <= len(slices) <= parts
        assert slices[0].start == start and slices[-1].end == end
        # every read starts and ends on a boundary the server agrees with (a GTID start, an Xid end,
        # a file start); a cut inside a transaction is a rows event of it
        assert {s.start for s in slices} | {s.end for s in slices} <= boundaries
        assert {s.emit_from for s in slices if s.emit_from} | {s.emit_to for s in slices if s.emit_to} <= rows_events
        pieces = [direct_read(cdc_settings, manifest, start, end, s) for s in slices]
        assert [r for p in pieces for r in p] == whole, f"parts={parts}: slices {slices} lose or repeat rows"
        if parts == 2:  # similar byte sizes: the cut sits near the middle of the range's bytes
            mid = (abs_pos(start) + abs_pos(end)) / 2
            cut = slices[0].emit_to or slices[0].end
            assert abs(abs_pos(cut) - mid) < (abs_pos(end) - abs_pos(start)) * 0.2


def test_capped_end_walks_the_range_in_whole_transactions(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(200), d DECIMAL(10,1))")
    start = current_offset(cdc_conn)
    load_mixed(mariadb, db, 15, rotate_every=6)
    # one transaction far bigger than the caps below: it must become a batch of its own
    mariadb.execute("BEGIN", *(f"INSERT INTO `{db}`.t VALUES ({50_000 + i}, 'big', 0)" for i in range(40)), "COMMIT")
    load_mixed(mariadb, db, 5, first_id=60_000)
    end = current_offset(cdc_conn)
    events = server_events(mariadb, start, end)
    bounds = BinlogBoundaries(cdc_conn)
    files = binlog_files(cdc_conn)
    boundaries = server_boundaries(events, files)
    for max_events, max_bytes in ((12, None), (None, 900), (30, 2000), (1, None)):
        pos, batches = start, []
        while pos < end:
            nxt = capped_end(bounds, files, pos, end, max_events, max_bytes)
            assert pos < nxt <= end
            batches.append((pos, nxt))
            pos = nxt
        for a, b in batches:
            inside = [e for e in events if a <= BinlogOffset(e[0], e[1]) < b]
            txs = sum(1 for e in inside if e[2] == "Gtid")
            nbytes = sum(e[3] - e[1] for e in inside)
            within = (max_events is None or len(inside) <= max_events) and (max_bytes is None or nbytes <= max_bytes)
            # over a cap only when one transaction (or a file's few header events, at a tiny cap) is the batch
            assert within or txs <= 1, f"batch {a}..{b}: {len(inside)} events, {nbytes} bytes, {txs} transactions"
            assert b == end or b in boundaries  # batches end at transaction boundaries
        assert len(batches) > 3
        # the caps do not stop at every transaction when several fit
        if max_events == 30:
            assert any(sum(1 for e in events if a <= BinlogOffset(e[0], e[1]) < b and e[2] == "Gtid") > 1
                       for a, b in batches)  # fmt: skip


# --------------------------------------------------------------------------------- through Spark
def test_a_filter_emits_exactly_the_changes_after_each_chunks_hw(binlog_spark, mariadb, db, cdc_settings, cdc_conn,
                                                                 tmp_path) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    t = f"{db}.t"
    mariadb.execute(
        f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(20))",
        f"CREATE TABLE `{db}`.not_captured (id INT PRIMARY KEY)",
        f"INSERT INTO {t} VALUES (1,'0'),(2,'0'),(3,'0'),(4,'0'),(101,'0'),(102,'0'),(103,'0'),(104,'0'),"
        "(201,'0'),(202,'0'),(203,'0'),(204,'0'),(205,'0')",
    )
    h0 = current_offset(cdc_conn)  # HW of chunk 0: (-inf, 100)
    mariadb.execute("BEGIN", f"UPDATE {t} SET v='A' WHERE id IN (1, 101, 201)",
                    f"INSERT INTO {t} VALUES (6,'A'),(106,'A'),(206,'A')", "COMMIT")  # fmt: skip  # tx A ends at h1
    h1 = current_offset(cdc_conn)  # HW of chunk 1: [100, 200) — tx B starts exactly here
    mariadb.execute(f"UPDATE {t} SET v='B' WHERE id IN (2, 102, 202)")  # tx B
    mariadb.execute(f"INSERT INTO `{db}`.not_captured VALUES (1)")
    mariadb.execute(f"UPDATE {t} SET id = 250 WHERE id = 104")  # tx C: chunk 1 -> chunk 2 (HW later)
    mariadb.execute(f"UPDATE {t} SET id = 7 WHERE id = 203")  # tx D: chunk 2 -> chunk 0
    mariadb.execute(f"UPDATE {t} SET id = 150 WHERE id = 3")  # tx E: chunk 0 -> chunk 1, both pass
    mariadb.execute(f"DELETE FROM {t} WHERE id IN (4, 204)")  # tx F
    h2 = current_offset(cdc_conn)  # HW of chunk 2: [200, +inf)
    mariadb.execute(f"UPDATE {t} SET v='G' WHERE id IN (205, 2)", f"INSERT INTO {t} VALUES (300,'G')")  # at/after h2
    assert h0 < h1 < h2

    path = tmp_path / "manifest.json"
    manifest = write_manifest(cdc_conn, path, {t: [(None, 100, h0), (100, 200, h1), (200, None, h2)]})
    assert manifest["start_offset"] == h0.to_dict()
    run = run_query(binlog_spark, cdc_settings, path, tmp_path / "ck", {"readers": 2, "min_bytes_per_reader": 0})
    rows = run.rows()

    assert ids(rows, t) == [
        ("u", 1, 1), ("c", None, 6),  # tx A: only chunk 0 (HW h0 = its start); 101/201/106/206 filtered
        ("u", 2, 2), ("u", 102, 102),  # tx B: chunk 1 emits from exactly h1; 202 (chunk 2) filtered
        ("d", 104, None),  # tx C: delete-half passes (chunk 1), upsert-half into chunk 2 filtered
        ("u", None, 7),  # tx D: delete-half in chunk 2 filtered, upsert-half into chunk 0 passes
        ("u", 3, 150),  # tx E: both halves pass
        ("d", 4, None),  # tx F: 204 (chunk 2) filtered
        ("u", 2, 2), ("u", 205, 205), ("c", None, 300),  # from h2 on everything passes
    ]  # fmt: skip
    assert {r[TBL] for r in rows} == {t}
    by_key = {(r[OP], r[BEFORE] and r[BEFORE]["id"]): r for r in rows}
    assert BinlogOffset(by_key[("u", 102)][FILE], by_key[("u", 102)][POS]) == h1  # the at-HW transaction
    assert by_key[("u", 102)][AFTER] == {"id": 102, "v": "B"}
    assert by_key[("u", 102)][BEFORE] == {"id": 102, "v": "0"}
    assert by_key[("d", 104)][AFTER] is None
    # seq orders the batch like (file_num, event_pos, row_index)
    assert [r[SEQ] for r in rows] == sorted(r[SEQ] for r in rows)
    assert [(r[FILE_NUM], r[EVENT_POS], r[ROW_INDEX]) for r in rows] == sorted(
        (r[FILE_NUM], r[EVENT_POS], r[ROW_INDEX]) for r in rows
    )


def test_b_parallel_decoding_matches_one_reader_across_rotations(binlog_spark, mariadb, db, cdc_settings, cdc_conn,
                                                                 tmp_path) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    t = f"{db}.t"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(200), d DECIMAL(10,1))")
    start = current_offset(cdc_conn)
    path = tmp_path / "manifest.json"
    manifest = write_manifest(cdc_conn, path, {t: [(None, None, start)]})
    load_mixed(mariadb, db, 36, rotate_every=12)
    end = current_offset(cdc_conn)
    expected = direct_read(cdc_settings, manifest, start, end)
    assert len({r[FILE_NUM] for r in expected}) >= 3

    one = run_query(binlog_spark, cdc_settings, path, tmp_path / "ck1", {"readers": 1})
    two = run_query(binlog_spark, cdc_settings, path, tmp_path / "ck2", {"readers": 2, "min_bytes_per_reader": 0})
    assert len(one.batches) == 1 and len(two.batches) == 1  # one uncapped batch each: the split is inside it
    assert no_seq(one.rows()) == expected
    assert no_seq(two.rows()) == expected
    assert {r[SEQ] >> SEQ_SHIFT for r in one.rows()} == {0}
    assert {r[SEQ] >> SEQ_SHIFT for r in two.rows()} == {0, 1}  # two decoders produced rows
    # the second decoder's rows come after the first's, in binlog order
    assert [r[SEQ] for r in two.rows()] == sorted(r[SEQ] for r in two.rows())
    assert two.offsets()[-1][1] >= end  # the server may append a Binlog_checkpoint event after a rotation


def test_c_max_events_caps_batches_at_transaction_boundaries(binlog_spark, mariadb, db, cdc_settings, cdc_conn,
                                                             tmp_path) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    t = f"{db}.t"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(200), d DECIMAL(10,1))")
    start = current_offset(cdc_conn)
    path = tmp_path / "manifest.json"
    manifest = write_manifest(cdc_conn, path, {t: [(None, None, start)]})
    load_mixed(mariadb, db, 9, rotate_every=5)
    mariadb.execute("BEGIN", *(f"INSERT INTO {t} VALUES ({90_000 + i}, 'big', 0)" for i in range(12)), "COMMIT")
    load_mixed(mariadb, db, 3, first_id=95_000)
    end = current_offset(cdc_conn)
    expected = direct_read(cdc_settings, manifest, start, end)

    cap = 20
    # no "readers": the default is the application's defaultParallelism, 2 on local[2]
    run = run_query(binlog_spark, cdc_settings, path, tmp_path / "ck",
                    {"max_events_per_trigger": cap, "min_bytes_per_reader": 0})  # fmt: skip
    assert no_seq(run.rows()) == expected  # nothing lost, nothing twice, in order
    assert any({r[SEQ] >> SEQ_SHIFT for r in rows} == {0, 1} for rows in run.batches.values())
    offsets = run.offsets()
    assert len(offsets) == len(run.batches) >= 5
    events = server_events(mariadb, start, end)
    for (a, b), bid in zip(offsets, sorted(run.batches), strict=True):
        a = a or start
        inside = [e for e in events if a <= BinlogOffset(e[0], e[1]) < b]
        txs = {e[1] for e in inside if e[2] == "Gtid"}
        assert len(inside) <= cap or len(txs) == 1, f"batch {a}..{b}: {len(inside)} events in {len(txs)} tx"
        # no transaction is split between batches: each row's transaction starts inside its batch
        assert all(a <= BinlogOffset(r[FILE], r[POS]) < b for r in run.batches[bid])
    assert offsets[-1][1] >= end


def test_d_restart_from_checkpoint_continues_exactly(binlog_spark, mariadb, db, cdc_settings, cdc_conn,
                                                     tmp_path) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    t = f"{db}.t"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(200), d DECIMAL(10,1))")
    start = current_offset(cdc_conn)
    path = tmp_path / "manifest.json"
    manifest = write_manifest(cdc_conn, path, {t: [(None, None, start)]})
    load_mixed(mariadb, db, 20, rotate_every=7)
    opts = {"max_events_per_trigger": 40, "readers": 2, "min_bytes_per_reader": 0}
    ck = tmp_path / "ck"
    # stopped with backlog left (processingTime + stop(): possibly in the middle of a batch)
    first = run_query(binlog_spark, cdc_settings, path, ck, opts, stop_after_batches=2)
    load_mixed(mariadb, db, 5, first_id=70_000)  # more changes while the stream is down
    end = current_offset(cdc_conn)
    second = run_query(binlog_spark, cdc_settings, path, ck, opts)
    assert second.batches, "the restarted query had nothing left to do: the stop did not leave a backlog"
    assert min(second.batches) >= 1 and min(second.batches) <= max(first.batches) + 1  # it resumed, not restarted
    union = dict(first.batches)
    for bid, rows in second.batches.items():
        if bid in union:  # replayed: the same offsets give the same rows
            assert no_seq(union[bid]) == no_seq(rows)
        union[bid] = rows
    got = [r for b in sorted(union) for r in union[b]]
    expected = direct_read(cdc_settings, manifest, start, end)
    assert no_seq(got) == expected
    assert second.offsets()[-1][1] >= end


def test_e_purged_start_offset_fails_with_the_resnapshot_message(binlog_spark, private_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.errors import StreamingQueryException

    server = private_server
    settings = server.cdc_settings()
    server.execute("CREATE DATABASE IF NOT EXISTS p", "CREATE TABLE p.purged (id INT PRIMARY KEY)")
    with settings.connect() as conn:
        hw = current_offset(conn)
        path = tmp_path / "manifest.json"
        write_manifest(conn, path, {"p.purged": [(None, None, hw)]})
    server.execute("INSERT INTO p.purged VALUES (1)", "FLUSH BINARY LOGS", "INSERT INTO p.purged VALUES (2)",
                   "FLUSH BINARY LOGS")  # fmt: skip
    server.purge_binary_logs_to(server.query("SHOW MASTER STATUS")[0][0])
    assert hw.file not in {f for f, *_ in server.query("SHOW BINARY LOGS")}
    with pytest.raises(StreamingQueryException) as info:
        run_query(binlog_spark, settings, path, tmp_path / "ck")
    text = str(info.value)
    assert f"binlog file {hw.file}" in text and "purged" in text
    assert "re-snapshot" in text and "binlog retention" in text


def test_f_idle_source_advances_on_other_tables_writes(binlog_spark, private_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = private_server
    settings = server.cdc_settings()
    server.execute("CREATE DATABASE IF NOT EXISTS q", "CREATE TABLE q.quiet (id INT PRIMARY KEY)",
                   "CREATE TABLE q.busy (id INT PRIMARY KEY)")  # fmt: skip
    with settings.connect() as conn:
        hw = current_offset(conn)
        path = tmp_path / "manifest.json"
        write_manifest(conn, path, {"q.quiet": [(None, None, hw)]})
    ck = tmp_path / "ck"
    server.execute(*(f"INSERT INTO q.busy VALUES ({i})" for i in range(5)), "FLUSH BINARY LOGS",
                   "INSERT INTO q.busy VALUES (100)")  # fmt: skip
    head1 = BinlogOffset(*server.query("SHOW MASTER STATUS")[0][:2])
    first = run_query(binlog_spark, settings, path, ck)
    assert first.rows() == []
    committed = first.offsets()[-1][1]
    assert committed >= head1 and committed.file_number > hw.file_number  # moved although no captured row did

    # The quiet table's start file can now be purged (up to the stream's offset) without stranding it.
    server.purge_binary_logs_to(committed.file)
    assert hw.file not in {f for f, *_ in server.query("SHOW BINARY LOGS")}
    server.execute("INSERT INTO q.busy VALUES (101)", "INSERT INTO q.quiet VALUES (1)")
    second = run_query(binlog_spark, settings, path, ck)
    assert [(r[OP], r[TBL], r[AFTER]) for r in second.rows()] == [("c", "q.quiet", {"id": 1})]


def test_g_server_restart_mid_read_resumes_exactly_once(binlog_spark, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """The server goes away while a task reads and while the driver plans: both wait for it and go on.

    Driven without Spark's scheduler (the task body and the driver calls directly) so the outage can
    be placed exactly: after the first Arrow batch of a partition, and around a latestOffset call.
    """
    import threading

    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import _parse_datatype_string

    from airflow_provider_mysqlcdc.stream.partition_read import read_partition
    from airflow_provider_mysqlcdc.stream.spark_source import BinlogPartition, MySqlBinlogStreamReader

    caplog.set_level(logging.WARNING, logger="airflow_provider_mysqlcdc.stream")  # planning and task loggers
    server = MariaDBServer()  # its own: it is stopped and started
    server.start()
    try:
        settings = server.cdc_settings()
        server.execute("CREATE DATABASE r", "CREATE TABLE r.t (id INT PRIMARY KEY, v VARCHAR(250))")
        with settings.connect() as conn:
            start = current_offset(conn)
            manifest = write_manifest(conn, tmp_path / "m.json", {"r.t": [(None, None, start)]})
        # big multi-row transactions: the break lands inside one (rows already emitted are not repeated)
        # ~8 MB of binlog: more than the socket buffers hold, so the stop is noticed mid-range
        pad = "x" * 180
        for lo in range(0, 40_000, 5000):
            server.execute("INSERT INTO r.t VALUES " + ",".join(f"({i}, '{pad}{i}')" for i in range(lo, lo + 5000)))
        server.execute("UPDATE r.t SET v = LEFT(v, 20) WHERE id % 7 = 0")
        with settings.connect() as conn:
            end = current_offset(conn)
        expected = direct_read(settings, manifest, start, end)

        reader = MySqlBinlogStreamReader(_parse_datatype_string(SCHEMA), {
            "source": json.dumps(settings.to_dict()), "manifest": str(tmp_path / "m.json"), "before_image": "full",
            "block_rows": "4096",
        })  # fmt: skip
        batches = read_partition(reader, BinlogPartition(0, start.to_dict(), end.to_dict(), 7480))
        got = [next(batches)]  # the read is under way, inside the first transaction
        server.stop()
        restarter = threading.Timer(1.5, server.start)
        restarter.start()
        got += list(batches)  # the connection breaks here; the reader waits for the server and resumes
        restarter.join()
        assert "resuming" in caplog.text  # the outage was noticed, not hidden by socket buffers
        rows = as_tuples(expand_changes(pa.Table.from_batches(got)))
        assert no_seq(rows) == expected
        assert [r[SEQ] for r in rows] == list(range(len(rows)))

        # the driver side: planning the next batch while the server is down waits for it too
        server.stop()
        restarter = threading.Timer(1.5, server.start)
        restarter.start()
        t0 = time.monotonic()
        latest = reader.latestOffset(start.to_dict(), ReadAllAvailable())
        restarter.join()
        assert time.monotonic() - t0 >= 1.0 and "retrying" in caplog.text  # it really waited
        assert BinlogOffset.from_dict(latest) >= end
        reader.stop()
    finally:
        server.destroy()


def test_h_one_huge_transaction_is_sliced_across_decoders_and_staged(binlog_spark, mariadb, db, cdc_settings,
                                                                     cdc_conn, tmp_path) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    """A transaction far above the caps is one batch, decoded by several tasks (cuts at rows events
    inside it), whose output past max_inline_bytes is staged; the changes are exactly one reader's."""
    from airflow_provider_mysqlcdc.core.offset import binlog_bytes
    from airflow_provider_mysqlcdc.mysql.binlog_ranges import slice_range

    t = f"{db}.t"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(200), d DECIMAL(10,1))")
    start = current_offset(cdc_conn)
    path = tmp_path / "manifest.json"
    manifest = write_manifest(cdc_conn, path, {t: [(None, None, start)]})
    mariadb.execute(f"INSERT INTO {t} VALUES (-1, 'before', 0)", database=db)
    pad = "p" * 150
    conn = mariadb.root_connection(db)
    try:
        with conn.cursor() as cur:  # one transaction: inserts, updates, key moves, deletes
            cur.execute("BEGIN")
            for lo in range(0, 12_000, 3000):
                values = ",".join(f"({i}, '{pad}{i}', {i % 97})" for i in range(lo, lo + 3000))
                cur.execute(f"INSERT INTO t VALUES {values}")
            cur.execute("UPDATE t SET v = CONCAT('u', v) WHERE id % 3 = 0")
            cur.execute("UPDATE t SET id = id + 100000 WHERE id % 5 = 0")
            cur.execute("DELETE FROM t WHERE id % 7 = 0")
            cur.execute("COMMIT")
    finally:
        conn.close()
    mariadb.execute(f"INSERT INTO {t} VALUES (-2, 'after', 0)", database=db)
    end = current_offset(cdc_conn)
    expected = direct_read(cdc_settings, manifest, start, end)

    files = binlog_files(cdc_conn)
    slices = slice_range(BinlogBoundaries(cdc_conn), files, start, end, 4, 0)
    assert len(slices) == 4 and sum(1 for s in slices if s.emit_from or s.emit_to) >= 3  # cut inside the transaction
    assert binlog_bytes(files, start, end) > 4 * 256 * 1024

    staged = tmp_path / "staged"
    run = run_query(binlog_spark, cdc_settings, path, tmp_path / "ck", {
        "readers": 4, "min_bytes_per_reader": 0, "max_events_per_trigger": 50, "staging": str(staged),
        "max_inline_bytes": 400_000,
    })  # fmt: skip
    assert no_seq(run.rows()) == expected  # every change once, in binlog order
    big_batches = [b for b in run.batches.values() if len(b) > 10_000]
    assert len(big_batches) == 1  # the transaction is one batch despite the cap
    assert len({r[SEQ] >> SEQ_SHIFT for r in big_batches[0]}) == 4  # four decoders shared it
    assert any(staged.rglob("part-*.arrow"))  # beyond max_inline_bytes the blocks went through files


def test_schema_matches_what_spark_checks(binlog_spark) -> None:  # type: ignore[no-untyped-def]
    """The batches are built with to_arrow_schema(schema, timezone='UTC'); pin the columns' Arrow types."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    arrow = to_arrow_schema(_parse_datatype_string(SCHEMA), timezone="UTC")
    assert arrow.names == ["tbl", "kind", "rows", "first_seq", "file", "pos", "commit_ts", "info", "block"]
    assert [f.type for f in arrow] == [pa.string(), pa.string(), pa.int32(), pa.int64(), pa.string(), pa.int64(),
                                       pa.int64(), pa.string(), pa.binary()]  # fmt: skip
