"""Which tables a DDL statement from the binlog touches, and how.

The binlog carries DDL as the statement text (a QUERY event, with the session's default database).
The stream must notice every statement that changes a captured table's shape or empties it,
because none of them produces row events: an ``ALTER TABLE ... ADD COLUMN`` would otherwise have
the new column's values silently dropped, and a ``TRUNCATE`` would leave the sink holding rows the
source no longer has. This module only recognises statements; what to do is the stream's call.

Pure: no I/O. Deliberately a recogniser for the statements that matter, not a SQL parser: a
statement it does not recognise is not DDL on a table (``CREATE INDEX`` and ``ANALYZE`` change no
row shape; ``CREATE TABLE`` of a new name cannot touch a captured table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_provider_mysqlcdc.core.table import TableId

ALTER = "alter"
TRUNCATE = "truncate"
DROP = "drop"
RENAME = "rename"
REPLACE = "replace"  # CREATE OR REPLACE TABLE: the old table is gone

# An unquoted identifier: ASCII letters, digits, $ and _, or any non-ASCII character (MySQL allows
# U+0080..U+FFFF). Written as "not the other ASCII characters": a class [\u0080-\uffff] is slow to
# compile, and every Spark Python worker imports this module (bench/RESULTS.md, "Worker start-up").
_IDENT = r"(?:`(?:[^`]|``)+`|[^\x00-\x23\x25-\x2f\x3a-\x40\x5b-\x5e\x60\x7b-\x7f]+)"
_NAME = rf"{_IDENT}(?:\s*\.\s*{_IDENT})?"
_COMMENTS = re.compile(r"/\*(?!!).*?\*/|--[^\n]*|#[^\n]*", re.S)
_VERSIONED = re.compile(r"/\*!\d*\s*(.*?)\*/", re.S)  # /*!50100 ... */ executable comments
_IF_EXISTS = r"(?:IF\s+EXISTS\s+)?"
_WAIT = r"(?:\s+(?:WAIT\s+\d+|NOWAIT))?"
_PAIR = rf"(?:{_NAME}{_WAIT}\s+TO\s+{_NAME})"

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (ALTER, re.compile(rf"^ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+{_IF_EXISTS}({_NAME})", re.I)),
    (TRUNCATE, re.compile(rf"^TRUNCATE\s+(?:TABLE\s+)?({_NAME})", re.I)),
    (DROP, re.compile(rf"^DROP\s+(?:TEMPORARY\s+)?TABLE\s+{_IF_EXISTS}((?:{_NAME})(?:\s*,\s*{_NAME})*)", re.I)),
    (RENAME, re.compile(rf"^RENAME\s+TABLES?\s+({_PAIR}(?:\s*,\s*{_PAIR})*)", re.I)),
    (REPLACE, re.compile(rf"^CREATE\s+OR\s+REPLACE\s+(?:TEMPORARY\s+)?TABLE\s+({_NAME})", re.I)),
]
_DROP_DATABASE = re.compile(rf"^DROP\s+(?:DATABASE|SCHEMA)\s+{_IF_EXISTS}({_IDENT})", re.I)
# ALTER TABLE a ..., RENAME [TO|AS] b: the table is renamed (whatever else the statement changes)
_RENAME_CLAUSE = re.compile(rf"^RENAME\s+(?:(?:TO|AS)\s+)?({_NAME})\s*;?$", re.I)


@dataclass(frozen=True)
class TableDdl:
    kind: str  # ALTER, TRUNCATE, DROP, RENAME, REPLACE
    table: str  # "db.table"


def _unquote(ident: str) -> str:
    ident = ident.strip()
    if ident.startswith("`") and ident.endswith("`"):
        return ident[1:-1].replace("``", "`")
    return ident


def _qualify(name: str, default_db: str | None) -> str | None:
    parts = re.findall(_IDENT, name)
    if len(parts) == 2:
        return str(TableId(_unquote(parts[0]), _unquote(parts[1])))
    if len(parts) == 1 and default_db:
        return str(TableId(default_db, _unquote(parts[0])))
    return None


def _clean(sql: str) -> str:
    sql = _VERSIONED.sub(r" \1 ", sql)
    return _COMMENTS.sub(" ", sql).strip()


def table_ddl(sql: str, default_db: str | None, captured: set[str] | frozenset[str] | None = None) -> list[TableDdl]:
    """The tables ``sql`` alters, empties, drops, renames or replaces (``db.table``), optionally
    only those in ``captured``. ``DROP DATABASE`` counts as dropping every captured table in it."""
    text = _clean(sql)
    out: list[TableDdl] = []
    m = _DROP_DATABASE.match(text)
    if m:
        db = _unquote(m.group(1))
        return [TableDdl(DROP, t) for t in sorted(captured or ()) if t.split(".", 1)[0] == db]
    pairs = _alter_rename(text, default_db)
    if pairs:
        return [TableDdl(RENAME, t) for t in dict.fromkeys(pairs[0]) if captured is None or t in captured]
    for kind, pattern in _PATTERNS:
        m = pattern.match(text)
        if not m:
            continue
        names = re.split(r"\s*,\s*|\s+TO\s+|\s+(?:WAIT\s+\d+|NOWAIT)\b", m.group(1), flags=re.I)
        for n in names:
            if not n.strip():
                continue
            q = _qualify(n, default_db)
            if q and (captured is None or q in captured) and TableDdl(kind, q) not in out:
                out.append(TableDdl(kind, q))
        break
    return out


# ---------------------------------------------------------------------- inside an ALTER TABLE
_RENAME_COLUMN = re.compile(rf"^RENAME\s+COLUMN\s+(?:IF\s+EXISTS\s+)?({_IDENT})\s+TO\s+({_IDENT})", re.I)
_CHANGE_COLUMN = re.compile(rf"^CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_IDENT})\s+({_IDENT})\s", re.I)
_ALTER_HEAD = re.compile(rf"^ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+{_IF_EXISTS}({_NAME})\s*", re.I)


def _clauses(text: str) -> list[str]:
    """The comma-separated clauses of an ALTER's body (commas inside parentheses or quotes kept)."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [c for c in out if c]


def column_renames(sql: str) -> dict[str, str]:
    """``{old: new}`` for the columns an ``ALTER TABLE`` renames (``RENAME COLUMN a TO b`` and
    ``CHANGE [COLUMN] a b <definition>``); a ``CHANGE`` that keeps the name is no rename.

    Why from the statement: the binlog's row images name their columns, but after a rename the
    schema alone cannot tell a renamed column from a dropped one plus an added one."""
    text = _clean(sql)
    head = _ALTER_HEAD.match(text)
    if head is None:
        return {}
    out: dict[str, str] = {}
    for clause in _clauses(text[head.end():]):
        m = _RENAME_COLUMN.match(clause) or _CHANGE_COLUMN.match(clause + " ")
        if m:
            old, new = _unquote(m.group(1)), _unquote(m.group(2))
            if old.lower() != new.lower():
                out[old] = new
    return out


def rename_pairs(sql: str, default_db: str | None) -> list[tuple[str, str]]:
    """``(from, to)`` table names (``db.table``) of a ``RENAME TABLE`` statement (or an ``ALTER TABLE``
    whose only clause is ``RENAME TO``), in order."""
    text = _clean(sql)
    m = _PATTERNS[3][1].match(text)
    if m is None:
        return _alter_rename(text, default_db)
    out = []
    for pair in re.split(r"\s*,\s*", m.group(1)):
        parts = re.split(r"\s+TO\s+", re.sub(r"\s+(?:WAIT\s+\d+|NOWAIT)\b", "", pair, flags=re.I), flags=re.I)
        if len(parts) == 2:
            a, b = _qualify(parts[0], default_db), _qualify(parts[1], default_db)
            if a and b:
                out.append((a, b))
    return out


def _alter_rename(text: str, default_db: str | None) -> list[tuple[str, str]]:
    """``[(a, b)]`` for an ``ALTER TABLE a`` with a ``RENAME TO b`` clause: a table rename like
    ``RENAME TABLE`` (what else it changes ends with the name: capture follows the rename)."""
    head = _ALTER_HEAD.match(text)
    if head is None:
        return []
    for clause in _clauses(text[head.end():]):
        m = _RENAME_CLAUSE.match(clause)
        if m and not re.match(r"(?:COLUMN|INDEX|KEY)$", m.group(1), re.I):
            a, b = _qualify(head.group(1), default_db), _qualify(m.group(1), default_db)
            return [(a, b)] if a and b else []
    return []


def is_table_swap(sql: str, default_db: str | None, table: str) -> bool:
    """Whether a ``RENAME TABLE`` both renames ``table`` away and another table in under its name:
    an online schema change tool's cut-over (gh-ost ``_t_gho``, pt-osc ``_t_new``), after which
    ``table`` still exists with the altered definition and the same rows."""
    pairs = rename_pairs(sql, default_db)
    return any(a == table for a, _ in pairs) and any(b == table for _, b in pairs)


CREATE = "create"
_CREATE = re.compile(rf"^CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?({_NAME})", re.I)


def created_table(sql: str, default_db: str | None) -> str | None:
    """The table (``db.table``) a ``CREATE TABLE`` statement creates, including ``CREATE TABLE ...
    LIKE`` and ``... SELECT`` (temporary tables and ``CREATE OR REPLACE`` are not creations of a new
    table: the first never reaches the binlog as rows, the second is :data:`REPLACE`)."""
    m = _CREATE.match(_clean(sql))
    return _qualify(m.group(1), default_db) if m else None


_SHADOW = re.compile(r"^_(.+)_(gho|new)$")  # gh-ost's and pt-online-schema-change's shadow tables


def shadow_of(table: str) -> str | None:
    """The table ``table`` (``db.table``) is the shadow copy of in an online schema change —
    ``db._t_gho`` (gh-ost) or ``db._t_new`` (pt-online-schema-change) of ``db.t`` — else None.

    Why: the tool fills the shadow table through the binlog (row copies and replayed changes) and
    renames it in under the original name at its cut-over; a stream that captured the shadow from
    its CREATE can continue the original table from the shadow's rows at that point."""
    try:
        tid = TableId.parse(table)
    except ValueError:  # not db.table
        return None
    m = _SHADOW.match(tid.table)
    return str(TableId(tid.database, m.group(1))) if m else None
