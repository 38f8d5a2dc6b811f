"""A compressed soak of the stream: many small micro-batches on one table, with table maintenance.

What an hour of streaming does to a Delta table — hundreds of copy-on-write commits — reproduced in
minutes and measured: each micro-batch is one small transaction on a real MariaDB table, read from
the binlog by the source's own task body and applied by the stream's own ``BatchApplier`` (the
``foreachBatch`` body), which runs table maintenance on its cadence. A reader thread reads the
latest version all along. Returned: disk use against live data, the versions the reader saw and
whether each held exactly the rows of its batch, and whether the sink equals the source.
Used by ``tests/integration/test_table_maintenance.py`` and ``bench/soak.py``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import MANIFEST, StateStore
from airflow_provider_mysqlcdc.stream.applier import BatchApplier
from airflow_provider_mysqlcdc.stream.job import StreamOptions
from tests.support.mariadb import MariaDBServer
from tests.support.verify import compare

TABLE = "soak.t"


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


class _Reader(threading.Thread):
    """Reads the latest version in a loop; records (version, rows, sum of v) or the error."""

    def __init__(self, uri: str):
        super().__init__(daemon=True)
        self.uri = uri
        self.seen: list[tuple[int, int, int]] = []
        self.errors: list[str] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                dt = DeltaTable(self.uri)
                t = pa.table(QueryBuilder().register("t", dt).execute("SELECT v FROM t").read_all())
                self.seen.append((dt.version(), t.num_rows, int(pc.sum(t.column("v")).as_py() or 0)))
            except Exception as exc:  # a vacuumed file under a reader: what the retention must prevent
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            self.stop_event.wait(0.02)


def run_soak(
    server: MariaDBServer,
    spark: Any,
    work: Path,
    batches: int,
    rows: int,
    policy: MaintenancePolicy,
    seed: int = 7,
) -> dict[str, Any]:
    from pyspark.sql.types import _parse_datatype_string

    from airflow_provider_mysqlcdc.stream.partition_read import SCHEMA, read_partition
    from airflow_provider_mysqlcdc.stream.spark_source import BinlogPartition, MySqlBinlogStreamReader

    server.execute("CREATE DATABASE IF NOT EXISTS soak")
    server.execute(
        "CREATE TABLE soak.t (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(120))",
        f"INSERT INTO soak.t SELECT seq, seq % 1000, RPAD(CONCAT('r', seq), 100, 'x') FROM seq_1_to_{rows}",
        database="soak",
    )
    settings = server.cdc_settings()
    store = StateStore(str(work / "state"), "soak")
    sink = DeltaSink(str(work / "lake"), owner="soak")
    with settings.connect() as conn:
        plan = plan_snapshot(conn, [TABLE], max(1000, rows // 8), 8)
        schema = read_table_schema(conn, TableId.parse(TABLE))
    store.write_plan("p1", plan.to_dict())
    for g in plan.groups:
        run_snapshot_group(spark, settings, store, "p1", g.group_id, sink)
    manifest = build_manifest(plan, store.read_all_results("p1"))
    store.write_manifest(manifest)
    applier = BatchApplier(store, sink, manifest, StreamOptions(maintenance=policy))
    options = {"source": json.dumps(settings.to_dict()), "manifest": store.url(MANIFEST)}
    reader = MySqlBinlogStreamReader(_parse_datatype_string(SCHEMA), options, 1)
    uri = sink.table_uri(TABLE)
    expected: dict[int, tuple[int, int]] = {}

    def record() -> None:
        n, total = server.query("SELECT COUNT(*), COALESCE(SUM(v), 0) FROM soak.t")[0]
        expected[DeltaTable(uri).version()] = (int(n), int(total))

    record()
    rnd = random.Random(seed)
    conn = server.root_connection("soak")
    cur = conn.cursor()
    with settings.connect() as c:
        pos = current_offset(c)
    watcher = _Reader(uri)
    watcher.start()
    t0 = time.monotonic()
    maintenance_rounds = 0
    last_data = None
    disk_after_first = 0
    disk_while_streaming = 0
    try:
        for batch_id in range(batches):
            cur.execute("BEGIN")
            for _ in range(rnd.randint(1, 6)):
                k = rnd.randint(1, rows + rows // 10)
                r = rnd.random()
                if r < 0.6:
                    cur.execute(f"UPDATE t SET v = v + 1, s = CONCAT('u', LEFT(s, 90)) WHERE id = {k}")
                elif r < 0.8:
                    cur.execute(f"INSERT IGNORE INTO t VALUES ({rows + k}, {k % 1000}, 'ins')")
                else:
                    cur.execute(f"DELETE FROM t WHERE id = {k}")
            cur.execute("COMMIT")
            with settings.connect() as c:
                end = current_offset(c)
            part = BinlogPartition(0, pos.to_dict(), end.to_dict(), 7300 + batch_id % 90)
            out = list(read_partition(reader, part)) if end > pos else []
            pos = end
            data = pa.Table.from_batches(out) if out else None
            if data is None or not data.num_rows:
                continue
            applier.apply_arrow(data, batch_id)
            last_data = (data, batch_id)
            record()
            if applier.maintain_if_due() is not None:
                maintenance_rounds += 1
                record()
        # Once the retention has passed with no new batch, a round leaves only what a reader may still
        # need; a second round one retention later also drops what the first round's compaction
        # replaced (a reader may have been reading it when it was replaced): the steady state.
        disk_while_streaming = _dir_bytes(uri)
        for _ in range(2 if policy.interval_seconds else 0):  # interval 0: the unmaintained baseline
            time.sleep(policy.retention_hours * 3600 + 0.5)
            applier.maintain_if_due(force=True)
            maintenance_rounds += 1
            record()
            if _ == 0:
                disk_after_first = _dir_bytes(uri)
    finally:
        watcher.stop_event.set()
        watcher.join()
        conn.close()
    seconds = time.monotonic() - t0
    # a replay of the last batch is recognised after all that maintenance (batch ids live in checkpoints)
    version_before = DeltaTable(uri).version()
    if last_data is not None:
        applier.apply_arrow(*last_data)
    replay_skipped = DeltaTable(uri).version() == version_before

    recorded = sorted(expected)
    wrong = []
    for v, n, total in watcher.seen:
        at = max((x for x in recorded if x <= v), default=None)
        if at is None or expected[at] != (n, total):
            wrong.append((v, n, total, None if at is None else expected[at]))
    live = int(sum(pa.table(DeltaTable(uri).get_add_actions(flatten=True)).column("size_bytes").to_pylist()))
    disk = _dir_bytes(uri)
    log_bytes = _dir_bytes(os.path.join(uri, "_delta_log"))
    with settings.connect() as c:
        cmp = compare(c, schema, sink.read(TABLE))
    return {
        "batches": batches,
        "rows": rows,
        "seconds": round(seconds, 1),
        "delta_versions": DeltaTable(uri).version(),
        "maintenance_rounds": maintenance_rounds,
        "live_bytes": live,
        "disk_bytes": disk,
        "disk_factor": round(disk / max(1, live), 2),
        "log_bytes": log_bytes,
        "disk_factor_right_after_a_compaction": round(disk_after_first / max(1, live), 2),
        "disk_factor_at_the_last_batch": round(disk_while_streaming / max(1, live), 2),
        "reader_reads": len(watcher.seen),
        "reader_versions": len({v for v, _, _ in watcher.seen}),
        "reader_errors": watcher.errors[:5],
        "reader_inconsistent": wrong[:5],
        "replay_skipped": replay_skipped,
        "sink_matches_source": cmp.match,
        "first_difference": cmp.first_difference,
    }


__all__ = ["run_soak"]
