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

ALTER = "alter"
TRUNCATE = "truncate"
DROP = "drop"
RENAME = "rename"
REPLACE = "replace"  # CREATE OR REPLACE TABLE: the old table is gone

_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
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
        return f"{_unquote(parts[0])}.{_unquote(parts[1])}"
    if len(parts) == 1 and default_db:
        return f"{default_db}.{_unquote(parts[0])}"
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
