"""``startup_mode`` ``timestamp`` and ``earliest-offset`` against a REAL MariaDB binlog.

Transactions a second apart, with binlog rotations between them so that the search has files to
choose from: a table added at a time between two known transactions starts exactly at the later
one, and the binlog read from that start (the stream's reader) carries exactly the later changes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig, PipelineConfigError
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.binlog_time import earliest_offset, offset_at_time
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError, binlog_files, current_offset
from airflow_provider_mysqlcdc.pipeline import plan_run
from airflow_provider_mysqlcdc.state import StateStore
from tests.support.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

SERVER_ID = 7301


def _offset(mariadb: MariaDBServer) -> BinlogOffset:
    f, p = mariadb.query("SHOW MASTER STATUS")[0][:2]
    return BinlogOffset(str(f), int(p))


def _next_second(mariadb: MariaDBServer) -> int:
    """Wait until the server's clock has moved to a new whole second; return that second."""
    start = int(mariadb.query("SELECT UNIX_TIMESTAMP()")[0][0])
    while (now := int(mariadb.query("SELECT UNIX_TIMESTAMP()")[0][0])) == start:
        time.sleep(0.05)
    return now


@pytest.fixture
def history(mariadb: MariaDBServer, db: str) -> dict[str, Any]:
    """Transactions A (ids 1-3), B (ids 4-5), C (id 6) in three different seconds and files."""
    mariadb.execute("CREATE TABLE t (id BIGINT NOT NULL PRIMARY KEY, v INT)", database=db)
    mariadb.execute("INSERT INTO t VALUES (1, 1), (2, 1), (3, 1)", database=db)
    mariadb.flush_binary_logs()
    between = _next_second(mariadb)  # after A's second, at or before B's
    mariadb.flush_binary_logs()
    b_start = _offset(mariadb)
    mariadb.execute("INSERT INTO t VALUES (4, 2), (5, 2)", database=db)
    mariadb.flush_binary_logs()
    _next_second(mariadb)
    mariadb.execute("UPDATE t SET v = 3 WHERE id = 6 OR id = 1", "INSERT INTO t VALUES (6, 3)", database=db)
    return {"table": f"{db}.t", "between": between, "b_start": b_start}


def test_timestamp_finds_the_first_transaction_at_or_after_it(
    cdc_settings: ConnectionSettings, cdc_conn: Any, history: dict[str, Any]
) -> None:
    found = offset_at_time(cdc_settings, cdc_conn, history["between"] + 0.4, SERVER_ID)
    assert found == history["b_start"]
    future = offset_at_time(cdc_settings, cdc_conn, time.time() + 3600, SERVER_ID)
    end = current_offset(cdc_conn)
    assert (future.file, future.pos) == (end.file, end.pos)  # nothing yet: the current end
    with pytest.raises(BinlogUnavailableError, match=r"has been purged: the oldest file .* Use a later timestamp"):
        offset_at_time(cdc_settings, cdc_conn, 1_000_000_000, SERVER_ID)


def test_a_table_added_at_a_timestamp_receives_exactly_the_later_changes(
    cdc_settings: ConnectionSettings, cdc_conn: Any, history: dict[str, Any], tmp_path: Path
) -> None:
    table = history["table"]
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(history["between"]))
    config = PipelineConfig.from_params(pipeline_id="ts", sink_root=str(tmp_path / "lake"),
                                        state_root=str(tmp_path / "state"), tables=[table],
                                        startup_mode="timestamp", startup_timestamp=iso)  # fmt: skip
    store = StateStore(config.state_root, "ts")
    outcome = plan_run(cdc_conn, store, config, "p1", lambda t: False, binlog_settings=cdc_settings)
    assert outcome.offset_tables == [table] and outcome.snapshot_tables == []
    start = store.read_plan_record("p1").offset_tables[table].offset
    assert (start.file, start.pos) == (history["b_start"].file, history["b_start"].pos)
    with BinlogRangeReader(cdc_settings, start, current_offset(cdc_conn), [table], SERVER_ID) as reader:
        changes = [(c.op, c.image["id"]) for c in reader]
    assert changes == [("c", 4), ("c", 5), ("u", 1), ("c", 6)]  # B and C; nothing of A


def test_earliest_offset_is_the_oldest_kept_file(cdc_conn: Any, tmp_path: Path) -> None:
    assert earliest_offset(cdc_conn) == BinlogOffset(binlog_files(cdc_conn)[0][0], 4)
    with pytest.raises(PipelineConfigError, match=r"startup_mode 'timestamp' needs startup_timestamp"):
        PipelineConfig.from_params(pipeline_id="x", sink_root="/l", state_root="/s", tables=["a.b"],
                                   startup_mode="timestamp")  # fmt: skip
    with pytest.raises(PipelineConfigError, match=r"startup_timestamp 'yesterday' is neither"):
        PipelineConfig.from_params(pipeline_id="x", sink_root="/l", state_root="/s", tables=["a.b"],
                                   startup_mode="timestamp", startup_timestamp="yesterday")  # fmt: skip
