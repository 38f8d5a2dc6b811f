"""What the stream knows of a small table it writes, carried from one micro-batch to the next.

Why: rewriting a small table per batch needs its version, its files, the batch ids it records and
its rows. Read from the table each time (a log update, a transaction lookup, a file read), that is
most of the cost of a batch that changes a few rows in each of hundreds of tables. The stream is
the table's only writer in the normal case, so after its own commit it knows all of it already.

The state is a claim, not a lock: the next commit is written as version ``version + 1`` with
put-if-absent (:mod:`~airflow_provider_mysqlcdc.sinks.delta_log`). If anything else committed
meanwhile (a schema change, a re-snapshot swap, a maintenance pass), that version exists, the
commit fails, and the state is read again from the table — a stale state costs a retry, never a
wrong row. docs/architecture.md, "Committing small tables".
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

#: Rows of small tables kept in memory across batches, at most (least recently used go first;
#: a table whose rows were dropped reads its files at its next batch).
ROWS_BUDGET_BYTES = 512 << 20


@dataclass
class TableState:
    """A table as of ``version``: its data files, schema, properties and (if kept) rows.

    ``log_blocker``: why this table's commits must go through delta-rs (None: the log is written
    directly). ``transactions``: the batch ids recorded, by app id (only those asked so far).
    """

    uri: str
    version: int
    schema: pa.Schema
    configuration: dict[str, str]
    files: dict[str, int]
    log_blocker: str | None
    transactions: dict[str, int | None] = field(default_factory=dict)
    rows: pa.Table | None = None

    @classmethod
    def of(cls, uri: str, dt: DeltaTable, log_blocker: str | None, app_id: str) -> TableState:
        """The state of ``dt`` (the table at ``uri``) at its loaded version, with the last batch of
        ``app_id`` it records."""
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        state = cls(
            uri=uri,
            version=dt.version(),
            schema=pa.schema(dt.schema().to_arrow()),
            configuration=dict(dt.metadata().configuration or {}),
            files=dict(zip(actions.get("path", []), actions.get("size_bytes", []), strict=True)),
            log_blocker=log_blocker,
        )
        state.recorded(app_id, dt)
        return state

    @property
    def size(self) -> int:
        return sum(self.files.values())

    def recorded(self, app_id: str, dt: DeltaTable | None) -> int | None:
        """The last batch of ``app_id`` the table records (asked of ``dt`` once, then carried)."""
        if app_id not in self.transactions:
            if dt is None:
                raise ValueError("the table must be loaded to ask its transactions")
            self.transactions[app_id] = dt.transaction_version(app_id)
        return self.transactions[app_id]


class TableStates:
    """The states of the tables one sink writes, shared by the threads applying a batch (each
    table is applied by one thread at a time); rows are kept within :data:`ROWS_BUDGET_BYTES`."""

    def __init__(self, rows_budget: int = ROWS_BUDGET_BYTES):
        self.rows_budget = rows_budget
        self._states: OrderedDict[str, TableState] = OrderedDict()
        self._rows_bytes: dict[str, int] = {}  # as accounted when each state was last put
        self._held = 0
        self._lock = threading.Lock()
        self._big: dict[str, Any] = {}  # uri -> delta_dv_table.BigTableState (tables with deletion vectors)

    def get(self, uri: str) -> TableState | None:
        with self._lock:
            state = self._states.get(uri)
            if state is not None:
                self._states.move_to_end(uri)
            return state

    def put(self, state: TableState) -> None:
        with self._lock:
            self._states[state.uri] = state
            self._states.move_to_end(state.uri)
            size = state.rows.nbytes if state.rows is not None else 0
            self._held += size - self._rows_bytes.get(state.uri, 0)
            self._rows_bytes[state.uri] = size
            self._trim()

    def forget(self, uri: str) -> None:
        """Drop what is known of the table at ``uri`` (its next batch reads it again)."""
        with self._lock:
            self._states.pop(uri, None)
            self._big.pop(uri, None)
            self._held -= self._rows_bytes.pop(uri, 0)

    def get_big(self, uri: str) -> Any:
        """The carried state of a big table written with deletion vectors, if any."""
        with self._lock:
            return self._big.get(uri)

    def put_big(self, state: Any) -> Any:
        with self._lock:
            self._big[state.uri] = state
            return state

    def committed(self, state: TableState, version: int, files: dict[str, int], rows: pa.Table | None,
                  app_transaction: tuple[str, int] | None) -> None:  # fmt: skip
        """``state``'s table after this writer's commit of ``version``: exactly ``files`` and ``rows``."""
        state.version, state.files, state.rows = version, files, rows
        if app_transaction is not None:
            state.transactions[app_transaction[0]] = app_transaction[1]
        self.put(state)

    @property
    def rows_bytes(self) -> int:
        """Bytes of rows held now."""
        return self._held

    def _trim(self) -> None:
        for uri, state in self._states.items():  # least recently used first
            if self._held <= self.rows_budget:
                break
            if state.rows is not None:
                self._held -= self._rows_bytes.get(uri, 0)
                self._rows_bytes[uri] = 0
                state.rows = None

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, uri: Any) -> bool:
        return uri in self._states


__all__ = ["ROWS_BUDGET_BYTES", "TableState", "TableStates"]
