"""CPU per change of the stream's task side: the rows decoder alone, and the whole task body.

    .venv/bin/python bench/decode.py [--rows 100000] [--rounds 5]

Creates its own private MariaDB with the fact table of ``bench/stream.py`` (``bench.orders``),
changes every row once as UPDATEs of 1,000 rows per transaction, then times, in this thread
(``time.thread_time``, so the figures do not depend on what else runs), ``--rounds`` times each:

* ``decoder_us_per_row``: ``BinlogRangeReader`` with the generated rows decoder and key-only before
  images over the range (what every stream task reads with);
* ``task_body_us_per_row``: the source's task body over the same range
  (``stream/partition_read.read_partition``: + the handoff filter and the change blocks).

Figures are medians over the rounds, in CPU microseconds per changed row. No Spark job runs (a
local session only provides the task's schema). Compare code by running this from two checkouts
one after the other, interleaved. Ends with one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa

from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.manifest_build import offset_table
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.splitter import load_collations
from airflow_provider_mysqlcdc.spark_session import build_spark_session
from airflow_provider_mysqlcdc.state import MANIFEST, StateStore
from airflow_provider_mysqlcdc.stream.partition_read import SCHEMA, read_partition
from airflow_provider_mysqlcdc.stream.spark_source import BinlogPartition, MySqlBinlogStreamReader
from bench.stream import TABLE, bulk_updates, offset_now
from tests.support.bench_data import load_orders
from tests.support.mariadb import MariaDBServer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="table rows, each changed once")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    spark = build_spark_session("mysqlcdc-bench-decode", master="local[1]")
    from pyspark.sql.types import _parse_datatype_string

    server = MariaDBServer()
    server.start()
    try:
        load_orders(server, args.rows)
        settings = server.cdc_settings()
        start = offset_now(settings)
        changed = bulk_updates(server, args.rows, args.rows, 1000)
        end = offset_now(settings)
        with settings.connect() as conn:
            schema = read_table_schema(conn, TableId.parse(TABLE))
            key = schema.chunk_key(None)
            collations = load_collations(conn, key, {})
        manifest = Manifest(start, {TABLE: offset_table(schema, [k.to_dict() for k in key], start)}, collations)
        store = StateStore(f"{tempfile.mkdtemp(prefix='mysqlcdc-bench-decode-')}/state", "decode")
        store.write_manifest(manifest)
        options = {"source": json.dumps(settings.to_dict()), "manifest": store.url(MANIFEST)}
        reader = MySqlBinlogStreamReader(_parse_datatype_string(SCHEMA), options, 1)
        decoder: list[float] = []
        task: list[float] = []
        for r in range(args.rounds):
            c0 = time.thread_time()
            n = 0
            with BinlogRangeReader(settings, start, end, [TABLE], 7400 + r, schemas={TABLE: schema},
                                   key_columns={TABLE: ["id"]}) as rr:  # fmt: skip
                for _ in rr:
                    n += 1
            decoder.append((time.thread_time() - c0) / n * 1e6)
            c0 = time.thread_time()
            out = pa.Table.from_batches(list(read_partition(reader, BinlogPartition(0, start.to_dict(),
                                                                                     end.to_dict(), 7500 + r))))
            task.append((time.thread_time() - c0) / n * 1e6)
            if n != changed or sum(out.column("rows").to_pylist()) != changed:
                raise RuntimeError(f"expected {changed} changes, the decoder saw {n}, the task body emitted "
                                   f"{sum(out.column('rows').to_pylist())}")  # fmt: skip
        print(json.dumps({
            "rows": changed, "rounds": args.rounds,
            "decoder_us_per_row": round(statistics.median(decoder), 2),
            "task_body_us_per_row": round(statistics.median(task), 2),
            "decoder_per_round": [round(x, 2) for x in decoder], "task_body_per_round": [round(x, 2) for x in task],
        }))  # fmt: skip
        return 0
    finally:
        server.stop()
        spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
