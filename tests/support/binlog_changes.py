"""The row changes of a binlog range decoded by python-mysql-replication alone, not by the stream's
decoders: what a changelog is checked against (an independent read of the same binlog)."""

from __future__ import annotations

import bisect
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from airflow_provider_mysqlcdc.core.change import RowChange
from airflow_provider_mysqlcdc.core.offset import BinlogOffset


def binlog_changes(server: Any, db: str, start: BinlogOffset, end: BinlogOffset) -> list[RowChange]:
    """Every row change of ``db`` in ``[start, end)``, with the offset its transaction starts at."""
    reader = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": server.port, "user": "root", "passwd": ""},
        server_id=4_000_001, log_file=start.file, log_pos=start.pos, resume_stream=True, blocking=False,
        only_schemas=[db], only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
    )  # fmt: skip
    out: list[RowChange] = []
    gtids: dict[str, list[int]] = {}
    try:
        for ev in reader:
            at = BinlogOffset(reader.log_file, ev.packet.log_pos - ev.event_size)
            if not at < end:
                break
            tx = _tx_start(server, at, gtids)
            op = {WriteRowsEvent: "c", UpdateRowsEvent: "u", DeleteRowsEvent: "d"}[type(ev)]
            for i, row in enumerate(ev.rows):
                before = row.get("before_values", row.get("values")) if op != "c" else None
                after = row.get("after_values", row.get("values")) if op != "d" else None
                out.append(RowChange(op, f"{db}.{ev.table}", before, after, tx, (0, at.pos), i,
                                     ev.timestamp))  # fmt: skip
    finally:
        reader.close()
    return out


def _tx_start(server: Any, at: BinlogOffset, gtids: dict[str, list[int]]) -> BinlogOffset:
    """The start of the transaction holding the event at ``at``: the last GTID event before it."""
    if at.file not in gtids:
        with server.root_connection() as conn, conn.cursor() as cur:
            cur.execute(f"SHOW BINLOG EVENTS IN '{at.file}'")
            gtids[at.file] = [int(r[1]) for r in cur.fetchall() if r[2] == "Gtid"]
    starts = gtids[at.file]
    i = bisect.bisect_right(starts, at.pos) - 1
    assert i >= 0, at
    return BinlogOffset(at.file, starts[i])
