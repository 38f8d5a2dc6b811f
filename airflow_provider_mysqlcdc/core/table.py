"""Table identity and schema as the source server reports it (read by ``mysql/schema.py``). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.keys import KeyColumn

_INT_TYPES = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"}
_STRING_TYPES = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext"}
_BYTES_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


class SourceSchemaError(ValueError):
    """A table or column is missing or unusable; the message names the fix."""


@dataclass(frozen=True, order=True)
class TableId:
    database: str
    table: str

    @classmethod
    def parse(cls, text: str) -> TableId:
        """``db.table``; a part holding a dot, a backtick or edge spaces is written in backticks, as in
        SQL (``shop.`order.items```, ```a``b`.t``) — the form :meth:`__str__` gives it."""
        parts = _name_parts(text.strip()) if isinstance(text, str) else None
        if parts is None or len(parts) != 2 or not all(parts):
            raise SourceSchemaError(
                f"table names must be written as <database>.<table>, got {text!r}; a name holding a dot or a "
                "backtick is written in backticks as in SQL, e.g. shop.`order.items` (a backtick doubled: `a``b`)"
            )
        return cls(parts[0], parts[1])

    def __str__(self) -> str:
        """``db.table``, each part in backticks only when it needs them: the canonical text of a table
        everywhere (manifest, plan, logs), parsed back by :meth:`parse`."""
        return f"{_text_part(self.database)}.{_text_part(self.table)}"

    @property
    def quoted(self) -> str:
        return f"{quote_ident(self.database)}.{quote_ident(self.table)}"

    @property
    def path(self) -> str:
        """``db/table`` as a lake path: the names as they are, a ``/`` or ``\\`` in one escaped (the
        only characters a directory name cannot hold)."""
        return f"{_path_part(self.database)}/{_path_part(self.table)}"


def quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _text_part(name: str) -> str:
    plain = name and "." not in name and "`" not in name and name == name.strip()
    return name if plain else quote_ident(name)


def _path_part(name: str) -> str:
    return name.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C") if "/" in name or "\\" in name else name


def _name_parts(text: str) -> list[str] | None:
    """The dot-separated parts of ``text``, each bare (no dot, no backtick) or in backticks (a
    doubled backtick inside is one); None when a quote is not closed or a bare part holds one."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == "`":
            j, buf = i + 1, []
            while True:
                k = text.find("`", j)
                if k < 0:
                    return None
                buf.append(text[j:k])
                if k + 1 < n and text[k + 1] == "`":
                    buf.append("`")
                    j = k + 2
                    continue
                break
            parts.append("".join(buf))
            i = k + 1
        else:
            k = text.find(".", i)
            part = text[i:] if k < 0 else text[i:k]
            if "`" in part:
                return None
            parts.append(part)
            i = n if k < 0 else k
        if i >= n:
            return parts
        if text[i] != ".":
            return None
        i += 1
        if i >= n:
            return [*parts, ""]


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    ordinal: int
    data_type: str  # e.g. "bigint", "varchar"
    column_type: str  # e.g. "bigint(20) unsigned", "enum('a','b')"
    nullable: bool
    charset: str | None = None
    collation: str | None = None
    numeric_precision: int | None = None
    numeric_scale: int | None = None
    datetime_precision: int | None = None
    char_max_length: int | None = None

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type.lower()

    def key_kind(self) -> str | None:
        """The chunk-key kind of this column, or None if it cannot order chunks."""
        t = self.data_type.lower()
        if t in _INT_TYPES:
            return keys.INT
        if t == "decimal":
            return keys.DECIMAL if (self.numeric_scale or 0) >= 0 else None
        if t in ("float", "double"):
            return keys.FLOAT
        if t in _STRING_TYPES:
            return keys.BYTES if (self.charset or "").lower() == "binary" else keys.STRING
        if t in _BYTES_TYPES:
            return keys.BYTES
        if t == "date":
            return keys.DATE
        if t in ("datetime", "timestamp"):
            return keys.DATETIME
        if t == "time":
            return keys.TIME
        if t == "year":  # 0 (YEAR 0000) and 1901..2155, compared as numbers
            return keys.INT
        if t == "bit":
            return keys.BIT
        return None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ColumnInfo:
        return cls(**d)


@dataclass
class TableSchema:
    table: TableId
    columns: list[ColumnInfo]
    primary_key: list[str] = field(default_factory=list)

    def column(self, name: str) -> ColumnInfo:
        for c in self.columns:
            if c.name.lower() == name.lower():
                return c
        raise SourceSchemaError(
            f"column {name!r} does not exist in {self.table}; columns are {', '.join(c.name for c in self.columns)}"
        )

    def chunk_key(self, chunk_key_columns: list[str] | None = None) -> list[KeyColumn]:
        """The chunk key: the configured columns, else the whole primary key.

        Whole-PK chunk keys (with row-value comparison) keep composite keys with a constant first
        column splittable; a prefix chunk key would put the whole table in one chunk (Flink CDC
        #2676).
        """
        names = chunk_key_columns or self.primary_key
        if not names:
            raise SourceSchemaError(
                f"table {self.table} has no primary key: give it a chunk key, NOT NULL columns covered by a UNIQUE "
                f"index (they are also the key its rows are merged by in the lake), e.g. "
                f"chunk_key_columns={{'{self.table}': ['<column>']}}, or add a primary key"
            )
        out = []
        for n in names:
            col = self.column(n)
            if col.nullable:
                raise SourceSchemaError(
                    f"chunk key column {self.table}.{col.name} is nullable: rows with NULL keys fall in no "
                    f"chunk. Make it NOT NULL, or choose a NOT NULL chunk key column"
                )
            kind = col.key_kind()
            if kind is None:
                raise SourceSchemaError(
                    f"chunk key column {self.table}.{col.name} has type {col.column_type}, which cannot order "
                    "chunks: choose an integer, decimal, string, binary, date, time, datetime, year or bit column"
                )
            out.append(KeyColumn(col.name, kind, col.collation if kind == keys.STRING else None))
        return out

    def merge_key(self, chunk_key_columns: list[str] | None = None) -> list[str]:
        """The columns rows are merged by in the lake: the primary key, or — for a table without one
        — its chunk key (which ``check_source`` requires to be covered by a UNIQUE index)."""
        return list(self.primary_key) or [k.name for k in self.chunk_key(chunk_key_columns)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": str(self.table),
            "columns": [c.to_dict() for c in self.columns],
            "primary_key": list(self.primary_key),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TableSchema:
        return cls(
            TableId.parse(d["table"]),
            [ColumnInfo.from_dict(c) for c in d["columns"]],
            list(d.get("primary_key", [])),
        )


def enum_values(column_type: str) -> list[str]:
    """Members of an ``enum('a','b')`` / ``set('a','b')`` column type, in definition order."""
    m = re.match(r"^\s*(?:enum|set)\s*\((.*)\)\s*$", column_type, re.IGNORECASE | re.DOTALL)
    if not m:
        return []
    body = m.group(1)
    out, cur, i, inq = [], [], 0, False
    while i < len(body):
        ch = body[i]
        if not inq:
            if ch == "'":
                inq = True
                cur = []
        elif ch == "'" and i + 1 < len(body) and body[i + 1] == "'":
            cur.append("'")
            i += 1
        elif ch == "'":
            inq = False
            out.append("".join(cur))
        elif ch == "\\" and i + 1 < len(body):
            cur.append(body[i + 1])
            i += 1
        else:
            cur.append(ch)
        i += 1
    return out
