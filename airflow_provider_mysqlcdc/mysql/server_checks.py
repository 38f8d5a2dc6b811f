"""Server-level checks: the binlog settings CDC needs, the CDC user's privileges, a replica's logging.

Cheap and table-independent, so every job runs them at start (:func:`check_server`); ``check``
adds the per-table checks (``mysql/checks.py``). Each problem names the setting or grant to add.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pymysql

from airflow_provider_mysqlcdc.mysql.server import ServerInfo, server_info, variables


@dataclass(frozen=True)
class SourceProblem:
    code: str  # stable identifier, e.g. "binlog_format"
    message: str  # what is wrong and how to fix it
    table: str | None = None

    def __str__(self) -> str:
        return self.message



def _binlog_off_problem(v: dict[str, str | None]) -> SourceProblem:
    """Every setting CDC needs at once: turning log_bin on takes a restart, so the DBA should restart once."""
    sid = v.get("server_id")
    settings = ["log_bin=mysql-bin", "binlog_format=ROW", "binlog_row_image=FULL"]
    if v.get("binlog_row_metadata") is not None:  # a server without the variable refuses it in my.cnf
        settings.append("binlog_row_metadata=FULL")
    settings.append(f"server_id={sid if sid and sid != '0' else 1}")
    flags = " ".join("--" + k.replace("_", "-") + "=" + val for k, _, val in (x.partition("=") for x in settings))
    return SourceProblem(
        "log_bin",
        "binary logging is off (log_bin=OFF): add all of these to the [mysqld] section of my.cnf, then "
        "restart the server once (log_bin cannot be turned on at runtime): " + ", ".join(settings)
        + f" (on the command line: {flags}; server_id must be unique among your servers and outside "
        "the connection's server_id_range)",
    )


def server_problems(conn: Any, info: ServerInfo) -> list[SourceProblem]:
    v = variables(conn, ["log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata", "server_id"])
    out = []
    if (v["log_bin"] or "OFF").upper() not in ("ON", "1"):
        return [_binlog_off_problem(v)]
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
    out += _replica_problems(conn, info) + _mysql_log_problems(conn, info)
    meta = v["binlog_row_metadata"]
    if meta is not None and meta.upper() != "FULL":
        out.append(SourceProblem(
            "binlog_row_metadata",
            f"binlog_row_metadata is {meta.upper()}; set it to FULL (SET GLOBAL binlog_row_metadata='FULL' and "
            "binlog_row_metadata=FULL in my.cnf): CDC needs column names in the binlog",
        ))
    return out


def _replica_problems(conn: Any, info: ServerInfo) -> list[SourceProblem]:
    """A replica writes the changes it replicates to its own binlog only with log_slave_updates
    (MySQL: log_replica_updates): without it, CDC from the replica sees none of the application's
    writes — silently."""
    with conn.cursor() as cur:
        try:
            cur.execute("SHOW SLAVE STATUS" if info.is_mariadb else "SHOW REPLICA STATUS")
            replica = cur.fetchone() is not None
        except pymysql.err.MySQLError:  # no privilege to ask: a primary needs none of this
            return []
    if not replica:
        return []
    name = "log_slave_updates" if info.is_mariadb else "log_replica_updates"
    value = variables(conn, [name, "log_slave_updates"])
    if (value[name] or value["log_slave_updates"] or "OFF").upper() in ("ON", "1"):
        return []
    return [SourceProblem(
        name,
        f"this server is a replica and {name} is OFF: the changes it replicates are not written to its binlog, "
        f"so CDC from it would see none of them. Set {name}=ON in my.cnf and restart it (or capture from the "
        "primary)",
    )]


def _mysql_log_problems(conn: Any, info: ServerInfo) -> list[SourceProblem]:
    """MySQL binlog options whose events this provider does not turn into whole row images."""
    if info.is_mariadb:
        return []
    v = variables(conn, ["binlog_transaction_compression", "binlog_row_value_options"])
    out = []
    if (v["binlog_transaction_compression"] or "OFF").upper() in ("ON", "1"):
        out.append(SourceProblem(
            "binlog_transaction_compression",
            "binlog_transaction_compression is ON: transactions are logged as compressed payloads, which this "
            "provider does not decode. SET GLOBAL binlog_transaction_compression=OFF (and in my.cnf / the "
            "parameter group)",
        ))
    if "PARTIAL_JSON" in (v["binlog_row_value_options"] or "").upper():
        out.append(SourceProblem(
            "binlog_row_value_options",
            "binlog_row_value_options is PARTIAL_JSON: JSON updates are logged as diffs, not whole values. SET "
            "GLOBAL binlog_row_value_options='' (and in my.cnf / the parameter group)",
        ))
    return out


def failover_warnings(conn: Any, info: ServerInfo) -> list[SourceProblem]:
    """Offsets survive a failover only by GTID set (docs/architecture.md, "Offsets and failover")."""
    if info.is_mariadb:
        return []  # MariaDB writes GTIDs always
    v = variables(conn, ["gtid_mode", "enforce_gtid_consistency"])
    if (v["gtid_mode"] or "OFF").upper() == "ON":
        return []
    return [SourceProblem(
        "gtid_mode",
        f"gtid_mode is {v['gtid_mode'] or 'OFF'}: the stream's offsets are file:pos of this server only, so after "
        "a failover to a replica every table must be snapshotted again. Set gtid_mode=ON and "
        "enforce_gtid_consistency=ON (in steps: OFF_PERMISSIVE, ON_PERMISSIVE, then ON; see MySQL's "
        "'Enabling GTID Transactions Online')",
    )]


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


def privilege_problems(conn: Any, info: ServerInfo) -> list[SourceProblem]:
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
    return server_problems(conn, info) + privilege_problems(conn, info)
