"""Table maintenance between micro-batches, spread so that no pause stalls the stream.

Why: compacting, checkpointing and vacuuming one Delta table costs tens of milliseconds
(bench/RESULTS.md, "Table maintenance of many tables"), so a round over hundreds of tables done in
one pause between two batches held every table's changes back for tens of seconds. A round starts
every ``interval_seconds``; each pause between batches then maintains tables until its time budget
is spent (at least one table, so a round always ends), in name order, and the round's summary is
recorded when its last table is done. Runs between batches, so the stream never writes a table
while it is maintained.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy, maintain_table

log = logging.getLogger(__name__)


class MaintenanceRounds:
    """Which tables the next pause maintains; ``step`` runs one pause's share of the round."""

    def __init__(self, sink: DeltaSink, policy: MaintenancePolicy, budget_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.sink, self.policy, self.budget_seconds, self.clock = sink, policy, budget_seconds, clock
        self.started_at = clock()  # the first round comes one interval after the start
        self.due: list[str] = []  # the running round's tables still to maintain
        self.done: dict[str, Any] = {}
        self.round_began = 0.0

    def step(self, tables: Iterable[str], orphans: Callable[[], bool], force: bool = False) -> dict[str, Any] | None:
        """Maintain the next tables of the round (all of them with ``force``); the round's summary when
        this step finished it, else None. ``orphans()`` says whether unreferenced files may go."""
        now = self.clock()
        if not self.due:
            if not force and (not self.policy.interval_seconds or now - self.started_at < self.policy.interval_seconds):
                return None
            self.started_at, self.round_began, self.done = now, time.time(), {}
            self.due = sorted(tables)
            log.info("maintenance round over %d table(s) begins (%.2fs of each pause between batches)",
                     len(self.due), self.budget_seconds)  # fmt: skip
        may_orphan = orphans()
        while self.due and (force or self.clock() - now < self.budget_seconds):  # the first table always
            t = self.due.pop(0)
            try:
                if self.sink.exists(t):
                    self.done[t] = maintain_table(self.sink, t, self.policy, orphans=may_orphan).to_dict()
            except Exception as exc:  # never fatal: disk use only grows until the next round
                log.warning("maintenance of %s failed (the next round tries again): %s", t, exc)
                self.done[t] = {"error": str(exc)[:500]}
        if self.due:
            return None
        log.info("maintenance round done: %d table(s) in %.1fs", len(self.done), time.time() - self.round_began)
        return {"at": time.time(), "tables": self.done}


__all__ = ["MaintenanceRounds"]
