"""Every concurrently running binlog reader of a pipeline has its own replication server_id, as the
source server sees it (docs/architecture.md, "Replication server_ids").

A 6-reader stream micro-batch (the real ``mysql_binlog`` source planning its partitions, each decoded
by ``read_partition``) and two snapshot groups' binlog window readers (ids from
``ServerIdLayout.group_id``, as ``run_snapshot_group`` takes them) run at once: every reader pauses
after its first change, with its replication connection open, while the test reads ``SHOW SLAVE
HOSTS`` and the server's Binlog Dump threads. Two readers with the same id would show as one
replica, and the server would have killed the first one's dump thread.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.chunk import ChunkGroup, SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import KeyColumn
from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.records import ChunkResult
from airflow_provider_mysqlcdc.core.server_ids import ServerIdLayout
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.binlog_reader import REPORT_HOST, BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset

pytestmark = pytest.mark.integration

RANGE = (8100, 8111)  # 12 ids: 6 for the stream's readers, 6 for snapshot groups
STREAM_READERS = 6
GROUPS = 2


def test_a_six_reader_stream_and_two_group_windows_have_distinct_server_ids(
    mariadb, db, cdc_settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.types import StructType

    from airflow_provider_mysqlcdc.stream import partition_read
    from airflow_provider_mysqlcdc.stream.partition_read import read_partition
    from airflow_provider_mysqlcdc.stream.spark_source import MySqlBinlogStreamReader

    settings = dataclasses.replace(cdc_settings, server_id_range=RANGE)
    layout = ServerIdLayout(RANGE, STREAM_READERS)
    layout.check(GROUPS)
    t = f"{db}.t"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(100))")
    with settings.connect() as conn:
        start = current_offset(conn)
        _write_manifest(conn, tmp_path / "m.json", t, start)
    for lo in range(0, 3000, 50):  # 60 transactions: enough boundaries for 6 slices
        mariadb.execute(f"INSERT INTO {t} VALUES " + ",".join(f"({i}, 'v{i}')" for i in range(lo, lo + 50)))
    with settings.connect() as conn:
        end = current_offset(conn)

    arrived = threading.Semaphore(0)
    go = threading.Event()

    class HeldReader(BinlogRangeReader):
        """Pauses after its first rows event, its replication connection open, until the test has looked.

        Blocking, so that the server keeps the dump thread (and its SHOW SLAVE HOSTS entry) while
        the reader pauses, instead of sending the small range at once and ending it; the reader still
        stops at the range's end by itself. Which server_id it uses is not changed."""

        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **{**kw, "blocking": True})

        def events(self) -> Iterator[Any]:  # what the stream's task reads (one item per rows event)
            changes = super().events()

            def held() -> Iterator[Any]:
                first = True
                for ch in changes:
                    yield ch
                    if first:
                        first = False
                        arrived.release()
                        go.wait(60)

            return held()

    monkeypatch.setattr(partition_read, "BinlogRangeReader", HeldReader)
    stream = MySqlBinlogStreamReader(StructType(), {  # the schema is only kept: no JVM needed
        "source": json.dumps(settings.to_dict()), "manifest": str(tmp_path / "m.json"),
        "readers": str(STREAM_READERS), "min_bytes_per_reader": "0",
    })  # fmt: skip
    parts = stream.partitions(start.to_dict(), end.to_dict())
    assert len(parts) == STREAM_READERS
    assert [p.server_id for p in parts] == list(layout.stream_block)
    group_ids = [layout.group_id(g) for g in range(GROUPS)]

    errors: list[BaseException] = []
    counts: dict[str, int] = {}

    def run(name: str, fn: Any) -> None:
        try:
            counts[name] = fn()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            arrived.release()

    def window(sid: int) -> int:
        with HeldReader(settings, start, end, [t], sid) as rr:
            return sum(1 for _ in rr)

    jobs = [threading.Thread(target=run, args=(f"stream-{p.index}", lambda p=p: sum(
        b.num_rows for b in read_partition(stream, p)))) for p in parts]  # fmt: skip
    jobs += [threading.Thread(target=run, args=(f"group-{g}", lambda s=s: window(s))) for g, s in enumerate(group_ids)]
    for j in jobs:
        j.start()
    try:
        for _ in jobs:
            assert arrived.acquire(timeout=60), "a reader did not start"
        assert not errors, errors
        root = mariadb.root_connection()
        try:
            with root.cursor() as cur:
                cur.execute("SHOW SLAVE HOSTS")
                hosts = [(int(r[0]), r[1]) for r in cur.fetchall()]
                cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                            "WHERE USER = %s AND COMMAND LIKE 'Binlog Dump%%'", (settings.user,))  # fmt: skip
                dumps = cur.fetchone()[0]
        finally:
            root.close()
    finally:
        go.set()
        for j in jobs:
            j.join(60)
    assert not errors, errors
    seen = sorted(sid for sid, host in hosts if host == REPORT_HOST and RANGE[0] <= sid <= RANGE[1])
    assert seen == sorted(layout.stream_block) + group_ids  # 8 readers, 8 distinct ids, as the server sees them
    assert dumps >= len(jobs)  # none was kicked off by a reader with the same id
    assert len(counts) == len(jobs)
    assert counts["group-0"] == counts["group-1"] == 3000  # the windows read the whole range, uninterrupted


def _write_manifest(conn: Any, path: Path, table: str, hw: Any) -> None:
    schema = read_table_schema(conn, TableId.parse(table))
    chunk = SnapshotChunk(table, 0, (KeyColumn("id", "int"),), None, None)
    plan = {"tables": {table: schema.to_dict()}, "groups": [ChunkGroup(0, [chunk]).to_dict()], "collations": {}}
    path.write_text(build_manifest(plan, [ChunkResult(table, 0, 0, hw, hw, 0, 0.0)]).to_json())
