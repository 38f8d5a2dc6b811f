"""How many apply processes a stream uses, which one owns a table, and that a dead one is replaced
(stream/apply_processes.py; a stream applied by them: tests/integration/test_apply_processes.py)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import INT, KeyColumn
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, FinishedChunk, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.stream.apply_processes import (
    AUTO_MAX_PROCESSES,
    AUTO_MIN_TABLES,
    ApplyProcesses,
    ApplySpec,
    processes_for,
    share_of,
)


@pytest.mark.parametrize(
    ("setting", "tables", "cores", "expected"),
    [
        (None, AUTO_MIN_TABLES - 1, 8, 0),  # few tables: the driver's threads
        (None, AUTO_MIN_TABLES, 1, 0),  # one core: nothing to gain
        (None, AUTO_MIN_TABLES, 2, 2),
        (None, 5000, 64, AUTO_MAX_PROCESSES),
        (0, 5000, 64, 0),  # set: as set
        (3, 1, 1, 3),
    ],
)
def test_processes_for(setting: int | None, tables: int, cores: int, expected: int) -> None:
    assert processes_for(setting, tables, cores) == expected


def test_a_table_is_owned_by_one_process_whatever_the_batch() -> None:
    uris = [f"/lake/db/t{i:03d}" for i in range(400)]
    shares = [share_of(u, 3) for u in uris]
    assert shares == [share_of(u, 3) for u in uris]  # stable: the same process every batch
    assert set(shares) == {0, 1, 2}
    assert min(shares.count(i) for i in range(3)) > 100  # spread evenly enough


def test_processes_are_configured_before_use() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ApplyProcesses(0)
    with ApplyProcesses(1) as procs, pytest.raises(RuntimeError, match="configure"):
        procs.apply(1, {"db.t": []}, {"/lake/db/t": ["db.t"]})


def _die_once(marker: str, value: int) -> int:
    """Kill the calling process the first time (as the OOM killer would), answer the second."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(9)
    return value


def _spec(tmp_path: Path, processes: int) -> ApplySpec:
    table = TableSchema(TableId("shop", "t"), [ColumnInfo("id", 1, "bigint", "bigint(20)", False)], ["id"])
    chunk = SnapshotChunk("shop.t", 0, (KeyColumn("id", INT),), None, None)
    manifest = Manifest.of({"shop.t": CapturedTable(table, ["id"], [FinishedChunk(chunk, BinlogOffset("b.1", 4))])})
    return ApplySpec.of(DeltaSink(str(tmp_path / "lake")), manifest, "app", threads=1, processes=processes)


def test_a_process_that_dies_while_applying_is_replaced_and_sent_its_share_again(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 2)
    with ApplyProcesses(2) as procs:
        procs.configure(spec)
        got = procs._run({0: str(tmp_path / "died-0"), 1: str(tmp_path / "died-1")}, _die_once, True, 7)
        assert got == {0: 7, 1: 7}
        assert (tmp_path / "died-0").exists() and (tmp_path / "died-1").exists()  # each died once


def _die(share: list[int]) -> int:
    os._exit(9)


def test_a_process_that_dies_again_fails_the_batch_with_the_way_out(tmp_path: Path) -> None:
    with ApplyProcesses(1) as procs:
        procs.configure(_spec(tmp_path, 1))
        with pytest.raises(RuntimeError, match=r"died twice.*apply_processes=0"):
            procs._run({0: [1]}, _die, True)


def _say(share: list[str]) -> int:
    logger = logging.getLogger("airflow_provider_mysqlcdc.stream.table_apply")
    logger.debug("not at the driver's level")
    logger.info("batch 3: %s: batch already applied; skipped", share[0])
    logging.getLogger("some.library").info("another library's chatter")
    return os.getpid()


def test_a_process_logs_through_the_drivers_loggers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="airflow_provider_mysqlcdc")
    with ApplyProcesses(1) as procs:
        procs.configure(_spec(tmp_path, 1))
        pid = procs._run({0: ["shop.t"]}, _say, True)[0]
    assert pid != os.getpid()
    lines = [(r.name, r.getMessage(), r.process) for r in caplog.records if r.process == pid]
    assert lines == [("airflow_provider_mysqlcdc.stream.table_apply", "batch 3: shop.t: batch already applied; skipped",
                      pid)]  # fmt: skip
