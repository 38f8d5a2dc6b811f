"""Where a table went: its name now, following the renames the binlog logged since an offset.

Why: the stream follows a DDL after it met it in the binlog, and reads the table's definition from
the server then (``stream/schema_follow.py``). A stream that is behind can meet an ALTER of a table
that has been renamed since: a gh-ost shadow ``_t_gho`` altered and then renamed in as ``t``
before the stream got there. The definition is then under the new name. The binlog says which:
every ``RENAME TABLE`` after the DDL, read with a one-shot (bounded, server_id 0) replication read
of the statements only (docs/architecture.md, "Schema changes").
"""

from __future__ import annotations

import logging

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import QueryEvent

from airflow_provider_mysqlcdc.core.ddl import DROP, REPLACE, rename_pairs, table_ddl
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql.binlog_reader import ONE_SHOT_SERVER_ID
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.server import current_offset, ensure_offset_available

log = logging.getLogger(__name__)


def name_now(settings: ConnectionSettings, table: str, since: BinlogOffset) -> str | None:
    """The name ``table`` (``db.table``) has on the source now, after the renames logged from ``since``
    to the binlog's current end; ``table`` itself if none moved it, None if it was dropped (or
    replaced) under the name it had."""
    with settings.connect() as conn:
        ensure_offset_available(conn, since)
        end = current_offset(conn)
    name = table
    stream = BinLogStreamReader(
        connection_settings=settings.replication_settings(),
        server_id=ONE_SHOT_SERVER_ID,  # registered as no replica: never kicks the pipeline's readers
        is_mariadb=False,  # file/pos dump (docs/architecture.md, "Pitfalls")
        resume_stream=True,
        log_file=since.file,
        log_pos=since.pos,
        blocking=False,
        only_events=[QueryEvent],
        enable_logging=False,
    )
    try:
        for ev in stream:
            if BinlogOffset(stream.log_file, stream.log_pos) > end:
                break  # logged after this call began: a busy server's dump would go on
            schema = ev.schema.decode() if isinstance(ev.schema, bytes | bytearray) else (ev.schema or None)
            for a, b in rename_pairs(ev.query, schema):  # in order: a TO b, b TO c moves a to c
                if a == name:
                    name = b
            if any(d.kind in (DROP, REPLACE) for d in table_ddl(ev.query, schema, frozenset({name}))):
                log.info("%s (renamed to %s) was dropped at %s:%s", table, name, stream.log_file, stream.log_pos)
                return None
    finally:
        stream.close()
    if name != table:
        log.info("%s has been renamed to %s since %s (the binlog's statements up to %s)", table, name, since, end)
    return name


__all__ = ["name_now"]
