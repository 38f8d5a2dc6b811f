"""Pre-flight checks of a CDC source: each problem comes with the fix, in words a DBA can act on."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pymysql

from airflow_provider_mysqlcdc.core.keys import STRING, Collation, KeyColumn
from airflow_provider_mysqlcdc.core.table import SourceSchemaError, TableId, TableSchema
from airflow_provider_mysqlcdc.core.types import UnsupportedColumnType, column_types
from airflow_provider_mysqlcdc.mysql.charsets import unsupported_reason
from airflow_provider_mysqlcdc.mysql.collation import UnsupportedCollationError, fetch_collation
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema, read_table_schemas
from airflow_provider_mysqlcdc.mysql.server import current_offset, server_info
from airflow_provider_mysqlcdc.mysql.server_checks import (
    SourceProblem,
    failover_warnings,
    privilege_problems,
    server_problems,
)


@dataclass
class SourceReport:
    """What ``check`` found: problems block CDC (``ok`` is False); warnings do not, but say where the
    lake can silently diverge from the source (e.g. cascading foreign keys)."""

    server_version: str = ""
    is_mariadb: bool = False
    offset: str | None = None
    tables: list[str] = field(default_factory=list)
    problems: list[SourceProblem] = field(default_factory=list)
    warnings: list[SourceProblem] = field(default_factory=list)

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
            "warnings": [{"code": w.code, "table": w.table, "message": w.message} for w in self.warnings],
        }

    def warnings_summary(self) -> str:
        """The warnings alone (empty when there are none), for callers that print them apart."""
        if not self.warnings:
            return ""
        return "\n".join([f"{len(self.warnings)} warning(s):"] + [f"  - {w.message}" for w in self.warnings])

    def summary(self) -> str:
        if self.ok:
            lines = [f"source OK: {self.server_version}, binlog at {self.offset}, {len(self.tables)} table(s)"]
        else:
            lines = [f"source check found {len(self.problems)} problem(s) on {self.server_version or 'the server'}:"]
            lines += [f"  - {p.message}" for p in self.problems]
        if self.warnings:
            lines.append(self.warnings_summary())
        return "\n".join(lines)


class SourceCheckError(RuntimeError):
    """Raised by operators when a source check fails; carries the report."""

    def __init__(self, report: SourceReport):
        super().__init__(report.summary())
        self.report = report


_ENGINE_ACTIONS = ("CASCADE", "SET NULL", "SET DEFAULT")

# KEY_COLUMN_USAGE lists each foreign key's columns and parent to a user with SELECT; MariaDB shows
# REFERENTIAL_CONSTRAINTS (the ON DELETE/UPDATE rules) only to users with a privilege beyond SELECT,
# so rules it hides are read from SHOW CREATE TABLE of the child. One table at a time, with constant
# schema and table names: the server then opens only that table to answer, not every table it has.
_FK_COLUMNS_SQL = """
SELECT CONSTRAINT_NAME, REFERENCED_TABLE_SCHEMA, REFERENCED_TABLE_NAME, COLUMN_NAME
FROM information_schema.KEY_COLUMN_USAGE
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND REFERENCED_TABLE_NAME IS NOT NULL
ORDER BY CONSTRAINT_NAME, ORDINAL_POSITION
"""
_FK_RULES_SQL = """
SELECT CONSTRAINT_NAME, DELETE_RULE, UPDATE_RULE
FROM information_schema.REFERENTIAL_CONSTRAINTS
WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s
"""

_FK_RULE = re.compile(r" ON (DELETE|UPDATE) (CASCADE|SET NULL|SET DEFAULT|RESTRICT|NO ACTION)")
_FK_LINE = re.compile(
    r'\s*CONSTRAINT (`(?:[^`]|``)+`|"(?:[^"]|"")+"|\S+) FOREIGN KEY .*\)((?: ON (?:DELETE|UPDATE) [A-Z ]+?)*),?$'
)


def _rules_from_create_table(conn: Any, tid: TableId) -> dict[str, dict[str, str]]:
    """``{constraint: {"delete": rule, "update": rule}}`` parsed from SHOW CREATE TABLE, one FK per line;
    an action not written there is RESTRICT."""
    with conn.cursor() as cur:
        cur.execute(f"SHOW CREATE TABLE {tid.quoted}")
        ddl = str(cur.fetchone()[1])
    out: dict[str, dict[str, str]] = {}
    for line in ddl.splitlines():
        m = _FK_LINE.match(line)
        if m:
            name = m.group(1)
            if name[0] in "`\"" and name[-1] == name[0]:  # backticks, or double quotes under ANSI_QUOTES
                name = name[1:-1].replace(name[0] * 2, name[0])
            rules = {"delete": "RESTRICT", "update": "RESTRICT"}
            rules.update({event.lower(): action for event, action in _FK_RULE.findall(m.group(2))})
            out[name] = rules
    return out


def _fk_effect(event: str, action: str, child: str, columns: list[str]) -> str:
    cols = ", ".join(f"{child}.{c}" for c in columns)
    if event == "DELETE" and action == "CASCADE":
        return f"the engine deletes {child} rows without a binlog row event; the lake keeps them"
    if action == "CASCADE":
        return (
            f"the engine changes {cols} to the parent's new key without a binlog row event; "
            "the lake keeps the old value"
        )
    target = "NULL" if action == "SET NULL" else "its default"
    return f"the engine sets {cols} to {target} without a binlog row event; the lake keeps the old value"


def cascading_fk_warnings(conn: Any, tables: list[str]) -> list[SourceProblem]:
    """Warnings for captured tables that are the child of an ON DELETE/UPDATE CASCADE, SET NULL or SET
    DEFAULT foreign key: InnoDB applies those actions inside the engine and the binlog records only
    the parent's change, so the child's copy in the lake silently diverges. Whether the parent is
    captured does not matter: the child is what diverges."""
    wanted: dict[tuple[str, str], TableId] = {}
    for name in tables:
        try:
            tid = TableId.parse(name)
        except SourceSchemaError:
            continue  # reported as a problem by the table checks
        wanted[(tid.database, tid.table)] = tid
    if not wanted:
        return []
    constraints: dict[tuple[str, str, str], dict[str, Any]] = {}
    try:
        for (schema, table), tid in wanted.items():
            with conn.cursor() as cur:
                cur.execute(_FK_COLUMNS_SQL, (schema, table))
                columns = cur.fetchall()
                if not columns:
                    continue
                cur.execute(_FK_RULES_SQL, (schema, table))
                rules = {name: {"delete": str(d).upper(), "update": str(u).upper()} for name, d, u in cur.fetchall()}
            if any(name not in rules for name, *_ in columns):
                rules = {**_rules_from_create_table(conn, tid), **rules}
            for name, ref_schema, ref_table, column in columns:
                c = constraints.setdefault((schema, table, name), {
                    "parent": f"{ref_schema or schema}.{ref_table}", "columns": [],
                    **rules.get(name, {"delete": "RESTRICT", "update": "RESTRICT"}),
                })
                c["columns"].append(column)
    except pymysql.err.MySQLError as exc:
        return [SourceProblem(
            "foreign_keys_unreadable",
            f"could not read foreign keys ({exc.args[-1] if exc.args else exc}): cascading foreign keys, whose "
            "changes to child tables the binlog does not record, were not checked",
        )]
    out = []
    for (schema, table, name), c in constraints.items():
        child = str(wanted[(schema, table)])
        for event in ("DELETE", "UPDATE"):
            action = c[event.lower()]
            if action not in _ENGINE_ACTIONS:
                continue
            out.append(SourceProblem(
                "cascading_foreign_key",
                f"{child}.{name}: ON {event} {action} from {c['parent']} — "
                f"{_fk_effect(event, action, child, c['columns'])} (see the README, \"Foreign keys with "
                "cascading actions\", for the choices)",
                child,
            ))
    return out


def row_filter_problem(conn: Any, table: str, condition: str) -> str | None:
    """The server's complaint about ``condition`` as a WHERE clause of ``table`` (None if it parses
    and names existing columns): ``EXPLAIN`` reads no rows."""
    tid = TableId.parse(table)
    try:
        with conn.cursor() as cur:
            cur.execute(f"EXPLAIN SELECT 1 FROM {tid.quoted} WHERE ({condition})")
            cur.fetchall()
    except Exception as exc:  # the server's own message is what the user needs
        args = getattr(exc, "args", ())
        return str(args[1] if len(args) > 1 else exc)
    return None


def _has_unique_index(conn: Any, table: TableId, columns: list[str]) -> bool:
    """Whether a UNIQUE index of ``table`` has exactly ``columns`` (in any order)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND NON_UNIQUE = 0",
            (table.database, table.table),
        )
        indexes: dict[str, set[str]] = {}
        for index, column in cur.fetchall():
            indexes.setdefault(str(index), set()).add(str(column).lower())
    return {c.lower() for c in columns} in indexes.values()


def _parsed(names: list[str]) -> list[TableId]:
    """The names that parse (a bad one is reported by the per-table check)."""
    out = []
    for name in names:
        try:
            out.append(TableId.parse(name))
        except SourceSchemaError:
            continue
    return out


_TEXT_TYPES = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext"}


def _undecodable_text(schema: TableSchema) -> str | None:
    """Why a text column's bytes cannot be decoded from the binlog as the server decodes them, or None."""
    for col in schema.columns:
        text = col.data_type.lower() in _TEXT_TYPES
        reason = unsupported_reason(col.charset) if text else None
        if reason is not None:
            return (f"column {col.name}: {reason}. Convert the column to utf8mb4 (ALTER TABLE ... MODIFY ... "
                    "CHARACTER SET utf8mb4) or leave the table out (exclude_tables)")  # fmt: skip
    return None


def _unordered_key(conn: Any, key: list[KeyColumn], seen: dict[str, Collation | str]) -> str | None:
    """Why a string chunk-key column's collation cannot place keys into chunks exactly, or None."""
    for col in key:
        if col.kind != STRING or not col.collation:
            continue
        if col.collation not in seen:
            try:
                seen[col.collation] = fetch_collation(conn, col.collation)
            except UnsupportedCollationError as exc:
                seen[col.collation] = str(exc)
        why = seen[col.collation]
        if isinstance(why, str):
            return f"chunk key column {col.name}: {why}"
    return None


def check_source(
    conn: Any,
    tables: list[str] | None = None,
    chunk_key_columns: dict[str, list[str]] | None = None,
) -> SourceReport:
    """Check the server's binlog settings, the user's privileges, and each table's chunk key; warn about
    captured tables whose rows the engine changes without a binlog event (cascading foreign keys)."""
    report = SourceReport()
    info = server_info(conn)
    report.server_version, report.is_mariadb = info.version, info.is_mariadb
    report.problems += server_problems(conn, info)
    report.problems += privilege_problems(conn, info)
    if not report.problems:
        try:
            report.offset = str(current_offset(conn, info))
        except (PermissionError, RuntimeError, pymysql.err.MySQLError) as exc:
            report.problems.append(SourceProblem("offset", str(exc)))
    ck = {str(TableId.parse(k)): v for k, v in (chunk_key_columns or {}).items()}
    known = read_table_schemas(conn, _parsed(tables or []))
    collations: dict[str, Collation | str] = {}  # name -> the collation, or why it cannot order a chunk key
    for name in tables or []:
        try:
            tid = TableId.parse(name)
            schema = known.get(tid) or read_table_schema(conn, tid)  # the latter says what is wrong
            key = schema.chunk_key(ck.get(str(tid)))
            if not schema.primary_key and not _has_unique_index(conn, tid, [k.name for k in key]):
                report.problems.append(SourceProblem(
                    "chunk_key_not_unique",
                    f"{tid} has no primary key, so its chunk key {[k.name for k in key]} is also the key rows are "
                    "merged by in the lake, and no UNIQUE index covers exactly those columns: rows with equal "
                    "values would overwrite each other. Choose NOT NULL columns with a UNIQUE index in "
                    "chunk_key_columns, or add a primary key",
                    name,
                ))  # fmt: skip
                continue
            unordered = _unordered_key(conn, key, collations)
            if unordered is not None:
                report.problems.append(SourceProblem("chunk_key_collation", f"{tid}: {unordered}", name))
                continue
            undecodable = _undecodable_text(schema)
            if undecodable is not None:
                report.problems.append(SourceProblem("character_set", f"{tid}: {undecodable}", name))
                continue
            try:
                column_types(schema)  # a type with no canonical value would fail its snapshot group
            except UnsupportedColumnType as exc:
                report.problems.append(SourceProblem("column_type", f"{tid}: {exc}", name))
                continue
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
    report.warnings += failover_warnings(conn, info) + cascading_fk_warnings(conn, tables or [])
    return report
