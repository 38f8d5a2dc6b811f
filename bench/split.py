"""Chunk-splitting benchmark: how long planning takes on the even and the uneven path.

    .venv/bin/python bench/split.py [--rows 2000000] [--chunk-size 8096]

Starts its own private MariaDB and loads the same rows twice (INSERT ... SELECT from the sequence
engine, a few statements per table):

* ``items_int``: ``BIGINT`` primary key, dense ids 1..N -> the even path (one GROUP BY histogram
  over the index, buckets packed into chunks);
* ``items_str``: ``VARCHAR(32)`` primary key (``MD5`` of the id, utf8mb4_general_ci) -> the uneven
  path (one ``ORDER BY key LIMIT n, 1`` per chunk, plus fetching and verifying the collation).

Then times :func:`split_table` for each, as the CDC user over TCP, and prints one JSON line on
stdout: ``{"rows", "even_seconds", "even_chunks", "uneven_seconds", "uneven_chunks", ...}``.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_provider_mysqlcdc.core.chunk import DEFAULT_CHUNK_SIZE
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.splitter import SplitOptions, split_table
from tests.support.mariadb import CDC_PASSWORD, CDC_USER, MariaDBServer

log = logging.getLogger("bench.split")
STEP = 500_000


def load(server: MariaDBServer, rows: int) -> None:
    server.execute("CREATE DATABASE bench")
    server.execute(
        "CREATE TABLE bench.items_int (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(40)) ENGINE=InnoDB",
        "CREATE TABLE bench.items_str (id VARCHAR(32) NOT NULL PRIMARY KEY, v INT NOT NULL, s VARCHAR(40)) "
        "ENGINE=InnoDB",
    )
    for lo in range(1, rows + 1, STEP):
        hi = min(rows, lo + STEP - 1)
        server.execute(
            f"INSERT INTO bench.items_int SELECT seq, seq * 10, CONCAT('row-', seq) FROM seq_{lo}_to_{hi}",
            database="bench",
        )
    # Same rows keyed by a 32-character hash; inserted in key order so the load stays sequential.
    for lo in range(1, rows + 1, STEP):
        hi = min(rows, lo + STEP - 1)
        server.execute(
            "INSERT INTO bench.items_str SELECT MD5(id), v, s FROM bench.items_int "
            f"WHERE id BETWEEN {lo} AND {hi} ORDER BY 1",
            database="bench",
        )
    server.execute("ANALYZE TABLE bench.items_int", "ANALYZE TABLE bench.items_str")


def timed_split(settings: ConnectionSettings, table: str, chunk_size: int) -> tuple[float, int, str]:
    with settings.connect() as conn:
        schema = read_table_schema(conn, TableId.parse(table))
        t0 = time.monotonic()
        result = split_table(conn, schema, SplitOptions(chunk_size))
        secs = time.monotonic() - t0
    return secs, len(result.splits), result.method


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    args = p.parse_args(argv)
    if args.rows < 1:
        p.error("--rows must be >= 1")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")

    with MariaDBServer() as server:
        t0 = time.monotonic()
        load(server, args.rows)
        load_secs = time.monotonic() - t0
        log.info("loaded 2 x %d rows in %.1fs", args.rows, load_secs)
        settings = ConnectionSettings(
            host="127.0.0.1", port=server.port, user=CDC_USER, password=CDC_PASSWORD, ssl=False
        )
        even_secs, even_chunks, even_method = timed_split(settings, "bench.items_int", args.chunk_size)
        log.info("items_int: %d chunks (%s) in %.2fs", even_chunks, even_method, even_secs)
        uneven_secs, uneven_chunks, uneven_method = timed_split(settings, "bench.items_str", args.chunk_size)
        log.info("items_str: %d chunks (%s) in %.2fs", uneven_chunks, uneven_method, uneven_secs)

    if even_method != "even" or uneven_method != "uneven":
        log.warning("unexpected split methods: %s / %s", even_method, uneven_method)
    print(json.dumps({
        "rows": args.rows,
        "chunk_size": args.chunk_size,
        "even_seconds": round(even_secs, 3),
        "even_chunks": even_chunks,
        "even_method": even_method,
        "uneven_seconds": round(uneven_secs, 3),
        "uneven_chunks": uneven_chunks,
        "uneven_method": uneven_method,
        "load_seconds": round(load_secs, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
