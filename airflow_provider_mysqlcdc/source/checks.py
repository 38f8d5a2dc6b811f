"""Pre-flight checks of a CDC source: each problem comes with the fix, in words a DBA can act on."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pymysql

from airflow_provider_mysqlcdc.source.schema import SourceSchemaError, TableId, read_table_schema
from airflow_provider_mysqlcdc.source.server import ServerInfo, current_offset, server_info, variables


@dataclass(frozen=True)
class SourceProblem:
    code: str  # stable identifier, e.g. "binlog_format"
    message: str  # what is wrong and how to fix it
    table: str | None = None

    def __str__(self) -> str:
        return self.message


@dataclass
class SourceReport:
    server_version: str = ""
    is_mariadb: bool = False
    offset: str | None = None
    tables: list[str] = field(default_factory=list)
    problems: list[SourceProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "server_version": self.server_version,
            "is_mariadb": self.is_mariadb,
            "offset": self.offset,
            "tables": self.tables,
            "problems": [{"code": p.code, "table": p.table, "message": p.message} for p in self.problems],
        }

    def summary(self) -> str:
        if self.ok:
            return f"source OK: {self.server_version}, binlog at {self.offset}, {len(self.tables)} table(s)"
        lines = [f"source check found {len(self.problems)} problem(s) on {self.server_version or 'the server'}:"]
        lines += [f"  - {p.message}" for p in self.problems]
        return "\n".join(lines)


class SourceCheckError(RuntimeError):
    """Raised by operators when a source check fails; carries the report."""

    def __init__(self, report: SourceReport):
        super().__init__(report.summary())
        self.report = report


def _server_problems(conn: Any, info: ServerInfo) -> list[SourceProblem]:
    v = variables(conn, ["log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata"])
    out = []
    if (v["log_bin"] or "OFF").upper() not in ("ON", "1"):
        out.append(SourceProblem(
            "log_bin",
            "binary logging is off (log_bin=OFF): start the server with log_bin enabled (--log-bin, or "
            "log_bin=mysql-bin in my.cnf), binlog_format=ROW, binlog_row_image=FULL, and restart it",
        ))
        return out
    fmt = (v["binlog_format"] or "").upper()
    if fmt != "ROW":
        out.append(SourceProblem(
            "binlog_format",
            f"binlog_format is {fmt or 'unknown'}; set it to ROW (SET GLOBAL binlog_format='ROW' and "
            "binlog_format=ROW in my.cnf; existing sessions keep the old format until they reconnect)",
        ))
    img = (v["binlog_row_image"] or "").upper()
    if img != "FULL":
        out.append(SourceProblem(
            "binlog_row_image",
            f"binlog_row_image is {img or 'unknown'}; set it to FULL (SET GLOBAL binlog_row_image='FULL' and "
            "binlog_row_image=FULL in my.cnf): CDC needs every column of every changed row",
        ))
    meta = v["binlog_row_metadata"]
    if meta is not None and meta.upper() != "FULL":
        out.append(SourceProblem(
            "binlog_row_metadata",
            f"binlog_row_metadata is {meta.upper()}; set it to FULL (SET GLOBAL binlog_row_metadata='FULL' and "
            "binlog_row_metadata=FULL in my.cnf): CDC needs column names in the binlog",
        ))
    return out


_GRANT_ON_ALL = re.compile(r"^GRANT (.+?) ON \*\.\* TO ", re.IGNORECASE)


def _global_privileges(conn: Any) -> set[str]:
    privs: set[str] = set()
    with conn.cursor() as cur:
        cur.execute("SHOW GRANTS FOR CURRENT_USER()")
        for (line,) in cur.fetchall():
            m = _GRANT_ON_ALL.match(str(line))
            if m:
                privs |= {p.strip().upper() for p in m.group(1).split(",")}
    return privs


def _privilege_problems(conn: Any, info: ServerInfo) -> list[SourceProblem]:
    privs = _global_privileges(conn)
    if "ALL PRIVILEGES" in privs or "SUPER" in privs:
        return []
    out = []
    if "REPLICATION SLAVE" not in privs and "REPLICATION REPLICA" not in privs:
        out.append(SourceProblem(
            "privilege_replication_slave",
            "the CDC user lacks REPLICATION SLAVE (needed to read the binlog): "
            "GRANT REPLICATION SLAVE ON *.* TO <cdc user>",
        ))
    if not privs & {"REPLICATION CLIENT", "BINLOG MONITOR"}:
        name = "BINLOG MONITOR" if info.is_mariadb and (info.major, info.minor) >= (10, 5) else "REPLICATION CLIENT"
        out.append(SourceProblem(
            "privilege_replication_client",
            f"the CDC user lacks {name} (needed to read binlog positions): GRANT {name} ON *.* TO <cdc user>",
        ))
    return out


def check_server(conn: Any) -> list[SourceProblem]:
    """Server-level problems only (binlog settings, privileges): cheap, run by every job at start."""
    info = server_info(conn)
    return _server_problems(conn, info) + _privilege_problems(conn, info)


def check_source(
    conn: Any,
    tables: list[str] | None = None,
    chunk_key_columns: dict[str, list[str]] | None = None,
) -> SourceReport:
    """Check the server's binlog settings, the user's privileges, and each table's chunk key."""
    report = SourceReport()
    info = server_info(conn)
    report.server_version, report.is_mariadb = info.version, info.is_mariadb
    report.problems += _server_problems(conn, info)
    report.problems += _privilege_problems(conn, info)
    if not report.problems:
        try:
            report.offset = str(current_offset(conn, info))
        except (PermissionError, RuntimeError, pymysql.err.MySQLError) as exc:
            report.problems.append(SourceProblem("offset", str(exc)))
    ck = {str(TableId.parse(k)): v for k, v in (chunk_key_columns or {}).items()}
    for name in tables or []:
        try:
            tid = TableId.parse(name)
            schema = read_table_schema(conn, tid)
            schema.chunk_key(ck.get(str(tid)))
            report.tables.append(str(tid))
        except SourceSchemaError as exc:
            code = "table"
            msg = str(exc)
            if "does not exist" in msg:
                code = "unknown_table"
            elif "no primary key" in msg:
                code = "no_primary_key"
            elif "nullable" in msg:
                code = "nullable_chunk_key"
            report.problems.append(SourceProblem(code, msg, name))
    return report
