"""Which source tables a pipeline captures: exact names, patterns, and exclusions.

Why patterns: a database has hundreds of tables and gains new ones; listing them by hand goes stale
(Flink CDC's ``tables`` / ``tables.exclude``, Paimon's ``--including_tables``). Three kinds of
entry, told apart by the characters they use, so that a plain name never turns into a pattern:

* exact — ``shop.orders`` (backticks allowed): that table; a problem with it fails the plan;
* glob — ``shop.*``, ``*.*``, ``shop.order_?``: ``*`` and ``?`` wildcards in the database and
  table parts, split at the dot;
* regex — any entry with one of ``\\ + ( ) [ ] { } | ^ $``: a Python regular expression matched
  against the whole ``database.table`` name, the dot between them written ``\\.``
  (``shop\\.order_[0-9]+``, ``db_[0-9]+\\.orders_[0-9]+``).

A table is selected when an entry of ``tables`` matches it and no entry of ``exclude_tables``
does. Tables that only a pattern selected are candidates: views, and tables the source checks
refuse, are reported and skipped rather than failing the run (docs/architecture.md, "Table
selection"). Pure: the catalog comes in as plain data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from airflow_provider_mysqlcdc.core.table import SourceSchemaError, TableId

_REGEX_CHARS = frozenset("\\+()[]{}|^$")
_GLOB_CHARS = frozenset("*?")


@dataclass(frozen=True)
class TablePattern:
    """One entry of ``tables`` or ``exclude_tables``, parsed."""

    text: str
    kind: str  # "exact" | "glob" | "regex"
    _regex: re.Pattern[str] = field(repr=False, compare=False)
    _parts: tuple[re.Pattern[str], re.Pattern[str]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> TablePattern:
        """Parse an entry; a ``ValueError`` names the entry and how to write it."""
        t = text.strip() if isinstance(text, str) else text
        if not isinstance(t, str) or not t:
            raise ValueError(f"{text!r} is not a table name or pattern; write <database>.<table>, e.g. shop.orders")
        if any(c in _REGEX_CHARS for c in t):
            try:
                return cls(t, "regex", re.compile(t))
            except re.error as exc:
                raise ValueError(f"{t!r} is not a valid regular expression ({exc}); write the dot between "
                                 "database and table as \\. e.g. shop\\.order_[0-9]+") from None  # fmt: skip
        if any(c in _GLOB_CHARS for c in t):
            try:
                parts = TableId.parse(t)  # a part holding a dot is written in backticks, as in a name
            except SourceSchemaError:
                raise ValueError(f"{t!r} is not a pattern written as <database>.<table> with * or ?, e.g. "
                                 "shop.*") from None  # fmt: skip
            globs = (re.compile(_glob(parts.database)), re.compile(_glob(parts.table)))
            return cls(t, "glob", re.compile(re.escape(t)), globs)
        try:
            exact = str(TableId.parse(t))  # canonical: a part holding a dot or a backtick stays quoted
        except SourceSchemaError:
            raise ValueError(f"{t!r} is not a table name written as <database>.<table>, e.g. shop.orders; a name "
                             "holding a dot or a backtick is written in backticks as in SQL, e.g. shop.`order.items` "
                             "(a backtick doubled: `a``b`)") from None  # fmt: skip
        return cls(exact, "exact", re.compile(re.escape(exact)))

    def matches(self, table: str) -> bool:
        if self._parts is not None:  # a glob matches the database and the table name each, whatever they hold
            tid = TableId.parse(table)
            return bool(self._parts[0].fullmatch(tid.database) and self._parts[1].fullmatch(tid.table))
        return self._regex.fullmatch(table) is not None


def _glob(part: str) -> str:
    """A glob part (the database's or the table's) as a regex over that part alone."""
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in part)


@dataclass(frozen=True)
class CatalogTable:
    """A table or view as ``information_schema.tables`` lists it."""

    name: str  # database.table
    kind: str = "BASE TABLE"  # TABLE_TYPE: BASE TABLE, VIEW, SEQUENCE (MariaDB), SYSTEM VERSIONED...

    @property
    def is_table(self) -> bool:
        """Whether rows of it reach the binlog as row events (views and sequences do not)."""
        return self.kind.upper() in ("BASE TABLE", "SYSTEM VERSIONED")


@dataclass
class Resolution:
    """What a selection resolved to against a catalog (reported by the plan)."""

    tables: list[str]  # selected, in catalog order; exact names first as given
    exact: set[str]  # the selected names given exactly (their problems are fatal)
    not_tables: dict[str, str] = field(default_factory=dict)  # matched by a pattern: views, sequences (kind)
    excluded: list[str] = field(default_factory=list)  # matched, then removed by exclude_tables
    unmatched_patterns: list[str] = field(default_factory=list)  # patterns that matched nothing


@dataclass(frozen=True)
class TableSelection:
    include: tuple[TablePattern, ...]
    exclude: tuple[TablePattern, ...] = ()

    @classmethod
    def parse(cls, tables: Sequence[str], exclude_tables: Sequence[str] = ()) -> TableSelection:
        """Parse both lists; a ``ValueError`` lists every bad entry."""
        problems: list[str] = []
        parsed: list[list[TablePattern]] = [[], []]
        for out, entries, what in ((parsed[0], tables, "tables"), (parsed[1], exclude_tables, "exclude_tables")):
            for e in entries:
                try:
                    p = TablePattern.parse(e)
                except ValueError as exc:
                    problems.append(f"{what}: {exc}")
                    continue
                if p not in out:
                    out.append(p)
        if problems:
            raise ValueError("; ".join(problems))
        return cls(tuple(parsed[0]), tuple(parsed[1]))

    @property
    def has_patterns(self) -> bool:
        return any(p.kind != "exact" for p in self.include)

    @property
    def exact_names(self) -> list[str]:
        return [p.text for p in self.include if p.kind == "exact"]

    def selects(self, table: str) -> bool:
        """Whether ``table`` (database.table) is selected: included and not excluded."""
        t = table.replace("`", "").strip()
        return any(p.matches(t) for p in self.include) and not any(p.matches(t) for p in self.exclude)

    def resolve(self, catalog: Iterable[CatalogTable]) -> Resolution:
        """The selected tables of ``catalog``. Exact names are kept even when the catalog lacks them
        (the source check then says the table does not exist, which is the useful error)."""
        entries = list(catalog)
        excluded_exact = [n for n in self.exact_names if any(p.matches(n) for p in self.exclude)]
        res = Resolution(tables=[n for n in self.exact_names if n not in excluded_exact],
                         exact=set(self.exact_names) - set(excluded_exact), excluded=excluded_exact)  # fmt: skip
        patterns = [p for p in self.include if p.kind != "exact"]
        hit: set[str] = set()
        for entry in entries:
            matching = [p for p in patterns if p.matches(entry.name)]
            if not matching or entry.name in res.exact:
                continue
            hit.update(p.text for p in matching)
            if any(p.matches(entry.name) for p in self.exclude):
                if entry.name not in res.excluded:
                    res.excluded.append(entry.name)
            elif not entry.is_table:
                res.not_tables[entry.name] = entry.kind
            elif entry.name not in res.tables:
                res.tables.append(entry.name)
        res.unmatched_patterns = [p.text for p in patterns if p.text not in hit]
        return res


__all__ = ["CatalogTable", "Resolution", "TablePattern", "TableSelection"]
