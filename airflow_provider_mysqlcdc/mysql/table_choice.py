"""Turn a pipeline's table selection into the tables a plan captures, against the live server.

One ``information_schema`` listing resolves every pattern; the source checks then run on the
candidates. A table that exists but cannot be captured (no primary key, a nullable chunk key, a
chunk key whose collation cannot be placed) is skipped with the reason, named exactly or selected
by a pattern, so one odd table never stops the capture of the rest; a table named exactly that does
not exist (a typo) and a server-wide problem fail the plan, as does a selection left with nothing
(docs/architecture.md, "Table selection").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_mysqlcdc.core.table_selection import TableSelection
from airflow_provider_mysqlcdc.mysql.checks import SourceCheckError, SourceProblem, SourceReport, check_source
from airflow_provider_mysqlcdc.mysql.schema import list_catalog

log = logging.getLogger(__name__)


#: Problems that fail the plan for a table named exactly: the name (or its chunk_key_columns) is wrong,
#: not the table.
EXACT_FATAL = frozenset({"unknown_table", "table"})


@dataclass
class TableChoice:
    """The tables a plan captures, and what the selection matched but left out (with why)."""

    tables: list[str]
    report: SourceReport
    skipped: dict[str, str] = field(default_factory=dict)  # table -> the check's message
    skipped_exact: list[str] = field(default_factory=list)  # of those, the ones named exactly
    not_tables: dict[str, str] = field(default_factory=dict)  # views, sequences -> their kind
    excluded: list[str] = field(default_factory=list)
    unmatched_patterns: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        """One line per thing a user should know about the selection (the plan task logs them)."""
        out = [f"skipped {t}: {why}" for t, why in self.skipped.items()]
        out += [f"skipped {t}: a {kind.lower()}, not a table (it has no rows in the binlog)"
                for t, kind in self.not_tables.items()]  # fmt: skip
        if self.excluded:
            out.append(f"excluded by exclude_tables: {self.excluded}")
        if self.unmatched_patterns:
            out.append(f"patterns that matched no table: {self.unmatched_patterns}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "tables": self.tables,
            "skipped": self.skipped,
            "not_tables": self.not_tables,
            "excluded": self.excluded,
            "unmatched_patterns": self.unmatched_patterns,
        }


def choose_tables(
    conn: Any, selection: TableSelection, chunk_key_columns: dict[str, list[str]] | None = None
) -> TableChoice:
    """Resolve ``selection`` and check the candidates; :class:`SourceCheckError` for a server-wide
    problem, a problem with an exactly named table, or when nothing is left to capture."""
    resolution = selection.resolve(list_catalog(conn) if selection.has_patterns else [])
    report = check_source(conn, resolution.tables, chunk_key_columns)
    fatal = [p for p in report.problems if p.table is None or (p.table in resolution.exact and p.code in EXACT_FATAL)]
    skipped = {str(p.table): p.message for p in report.problems if p not in fatal}
    choice = TableChoice(
        tables=[t for t in resolution.tables if t not in skipped],
        report=replace(report, problems=fatal),
        skipped=skipped,
        skipped_exact=[t for t in skipped if t in resolution.exact],
        not_tables=resolution.not_tables,
        excluded=resolution.excluded,
        unmatched_patterns=resolution.unmatched_patterns,
    )
    if fatal:
        raise SourceCheckError(choice.report)
    if not choice.tables:
        raise SourceCheckError(replace(report, problems=[_nothing_selected(selection, choice)]))
    if selection.has_patterns:
        log.info("tables selected by %s: %d (%s)", [p.text for p in selection.include], len(choice.tables),
                 ", ".join(choice.tables))  # fmt: skip
    return choice


def _nothing_selected(selection: TableSelection, choice: TableChoice) -> SourceProblem:
    why = "; ".join(choice.notes()) or "no table matched"
    return SourceProblem(
        "no_tables",
        f"tables {[p.text for p in selection.include]} select no table that can be captured ({why}). Check the "
        "patterns against SHOW TABLES (names are case-sensitive; a regex writes the dot as \\.), and that the "
        "CDC user may SELECT the tables",
    )


__all__ = ["TableChoice", "choose_tables"]
