"""SQL predicates that select exactly one split's rows, in the database's own key order.

Composite keys use the row-value comparison ``(a, b) >= (x, y)`` written out as
``a > x OR (a = x AND b >= y)``: identical semantics, and both MariaDB and MySQL turn the expanded
form into index ranges (the naive ``a >= x AND b >= y`` is wrong: Flink CDC #2676/#1108).
Comparisons are made by the server, so its collation decides; string literals carry the column's
charset, so they never force a collation conversion.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import Collation, KeyColumn


def quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


_UTF8 = frozenset({"utf8mb4", "utf8mb3", "utf8"})


def sql_literal(col: KeyColumn, value: Any, collations: dict[str, Collation] | None = None) -> str:
    """An injection-proof SQL literal for a key value (used where parameters cannot be: JDBC predicates)."""
    if col.kind in (keys.INT, keys.BIT):
        return str(int(value))
    if col.kind == keys.TIME:
        return "'" + keys.time_text(value) + "'"
    if col.kind == keys.DECIMAL:
        d = Decimal(value)
        if not d.is_finite():
            raise ValueError(f"non-finite decimal key {value!r}")
        return format(d, "f")
    if col.kind == keys.FLOAT:
        return repr(float(value))
    if col.kind == keys.BYTES:
        return "X'" + bytes(value).hex() + "'"
    if col.kind == keys.STRING:
        coll = (collations or {}).get(col.collation or "")
        charset = coll.charset if coll else "utf8mb4"
        if not charset.replace("_", "").isalnum():
            raise ValueError(f"bad charset name {charset!r}")
        utf8 = str(value).encode("utf-8").hex()
        if charset.lower() in _UTF8:
            return f"_{charset} X'{utf8}'"
        # Any other set: the server converts the text (Python's codec of a set's name is often not the
        # server's: latin1's five extra bytes, macce, big5, sjis, utf16 ...), in the column's collation.
        if coll is None or not coll.name.replace("_", "").isalnum():
            raise ValueError(f"no usable collation for string key column {col.name} in {charset}")
        return f"(CONVERT(_utf8mb4 X'{utf8}' USING {charset}) COLLATE {coll.name})"
    if col.kind == keys.DATE:
        return "'" + (value if isinstance(value, str) else value.isoformat()) + "'"
    if col.kind == keys.DATETIME:
        if isinstance(value, dt.datetime):
            value = value.isoformat(sep=" ")
        return "'" + str(value).replace("'", "") + "'"
    raise ValueError(f"unsupported key kind {col.kind!r}")


def _compare(cols: Sequence[KeyColumn], values: Sequence[Any], strict: str, last: str, lit) -> str:
    """Expanded row comparison ``(cols) <last-op> (values)`` with ``strict`` for the prefix."""
    terms = []
    for i, col in enumerate(cols):
        eqs = [f"{quote_ident(c.name)} = {lit(c, v)}" for c, v in zip(cols[:i], values[:i], strict=True)]
        op = last if i == len(cols) - 1 else strict
        eqs.append(f"{quote_ident(col.name)} {op} {lit(col, values[i])}")
        terms.append("(" + " AND ".join(eqs) + ")")
    return "(" + " OR ".join(terms) + ")" if len(terms) > 1 else terms[0]


def range_condition(
    cols: Sequence[KeyColumn],
    start: Sequence[Any] | None,
    end: Sequence[Any] | None,
    collations: dict[str, Collation] | None = None,
) -> str:
    """``start <= key < end`` as SQL with inlined literals; ``1=1`` when both ends are open."""
    def lit(c: KeyColumn, v: Any) -> str:
        return sql_literal(c, v, collations)

    parts = []
    if start is not None:
        parts.append(_compare(cols, start, ">", ">=", lit))
    if end is not None:
        parts.append(_compare(cols, end, "<", "<", lit))
    return " AND ".join(parts) if parts else "1=1"


def split_condition(split: SnapshotChunk, collations: dict[str, Collation] | None = None) -> str:
    return range_condition(split.key_columns, split.start, split.end, collations)
