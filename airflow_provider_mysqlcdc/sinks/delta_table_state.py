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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
from pyroaring import BitMap

#: Rows of small tables kept in memory across batches, at most (least recently used go first;
#: a table whose rows were dropped reads its files at its next batch).
ROWS_BUDGET_BYTES = 512 << 20


@dataclass
class Located:
    """Where each row of a state's ``rows`` lies: ``files[file_no[i]]`` at row ``position[i]``."""

    files: list[str]
    file_no: np.ndarray
    position: np.ndarray

    def kept(self, keep: np.ndarray) -> Located:
        return Located(self.files, self.file_no[keep], self.position[keep])

    def plus_file(self, rel: str, rows: int) -> Located:
        """These rows, then the ``rows`` rows of a new file ``rel``."""
        files = [*self.files, rel]
        return Located(files, np.concatenate([self.file_no, np.full(rows, len(files) - 1, dtype=np.int32)]),
                       np.concatenate([self.position, np.arange(rows, dtype=np.uint32)]))  # fmt: skip

    @classmethod
    def one_file(cls, rel: str, rows: int) -> Located:
        return cls([rel], np.zeros(rows, dtype=np.int32), np.arange(rows, dtype=np.uint32))


@dataclass
class TableState:
    """A table (a routed shard: its partition) as of ``version``: its data files, schema,
    properties and (if kept) rows.

    ``log_blocker``: why this table's commits must go through delta-rs (None: the log is written
    directly). ``transactions``: the batch ids recorded, by app id (only those asked so far).
    ``key``: the state's key among the sink's states (the table's URI; a shard's: URI@shard).
    ``partition``: a routed shard's partition values. ``adds``: the live files' add actions as the
    log holds them (None: not read; the table then has no deletion vector), with ``vectors`` (the
    deleted rows of files that have one), ``protocol`` and ``metadata`` — what a commit marking rows
    deleted needs. ``physical``: rows each file holds before its vector; ``located``: where each of
    ``rows`` lies.
    """

    uri: str
    version: int
    schema: pa.Schema
    configuration: dict[str, str]
    files: dict[str, int]
    log_blocker: str | None
    transactions: dict[str, int | None] = field(default_factory=dict)
    rows: pa.Table | None = None
    key: str = ""
    partition: dict[str, str] = field(default_factory=dict)
    adds: dict[str, dict[str, Any]] | None = None
    vectors: dict[str, BitMap] = field(default_factory=dict)
    protocol: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    physical: dict[str, int] = field(default_factory=dict)
    located: Located | None = None

    def __post_init__(self) -> None:
        self.key = self.key or self.uri

    @classmethod
    def of(cls, uri: str, dt: DeltaTable, log_blocker: str | None, app_id: str, schema: pa.Schema | None = None,
           partition: Mapping[str, str] | None = None, key: str | None = None) -> TableState:  # fmt: skip
        """The state of ``dt`` (the table at ``uri``) at its loaded version, with the last batch of
        ``app_id`` it records; a routed shard's (``partition``: its values, ``schema``: its files'
        columns) holds only its own files."""
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        paths, sizes = actions.get("path", []), actions.get("size_bytes", [])
        mine = [all(actions.get(f"partition.{c}", [None] * len(paths))[i] == v for c, v in (partition or {}).items())
                for i in range(len(paths))]  # fmt: skip
        state = cls(
            uri=uri,
            version=dt.version(),
            schema=schema if schema is not None else pa.schema(dt.schema().to_arrow()),
            configuration=dict(dt.metadata().configuration or {}),
            files={p: n for p, n, m in zip(paths, sizes, mine, strict=True) if m},
            log_blocker=log_blocker,
            key=key or uri,
            partition=dict(partition or {}),
        )
        state.recorded(app_id, dt)
        return state

    @property
    def size(self) -> int:
        return sum(self.files.values())

    @property
    def live_size(self) -> int:
        """The bytes of the files, less the share of their rows a deletion vector deletes: about what
        a rewrite of the table as one file writes."""
        total = 0.0
        for rel, n in self.files.items():
            deleted, rows = len(self.vectors.get(rel, ())), self.physical.get(rel, 0)
            total += n * (1 - deleted / rows) if deleted and rows else n
        return int(total)

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
        self._latest: dict[str, int] = {}  # uri -> the newest version committed by this sink's states

    def get(self, uri: str) -> TableState | None:
        with self._lock:
            state = self._states.get(uri)
            if state is not None:
                self._states.move_to_end(uri)
            return state

    def put(self, state: TableState) -> None:
        with self._lock:
            self._states[state.key] = state
            self._states.move_to_end(state.key)
            size = state.rows.nbytes if state.rows is not None else 0
            self._held += size - self._rows_bytes.get(state.key, 0)
            self._rows_bytes[state.key] = size
            self._trim()

    def forget(self, uri: str) -> None:
        """Drop what is known of the table at ``uri`` — every routed shard's state of it too — (its
        next batch reads it again)."""
        with self._lock:
            for key in [k for k in self._states if k == uri or k.startswith(f"{uri}@")]:
                self._states.pop(key, None)
                self._held -= self._rows_bytes.pop(key, 0)
            self._big.pop(uri, None)

    def forget_key(self, key: str) -> None:
        """Drop one state (a routed shard's: the others of its table stay)."""
        with self._lock:
            self._states.pop(key, None)
            self._held -= self._rows_bytes.pop(key, 0)

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
        with self._lock:  # a routed table's other shards catch up with it before their next commit
            self._latest[state.uri] = max(self._latest.get(state.uri, -1), version)

    def latest_known(self, uri: str) -> int | None:
        """The newest version this sink committed to the table at ``uri`` by writing its log (a
        routed shard's state behind it catches up before its commit), if any."""
        with self._lock:
            return self._latest.get(uri)

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
                state.rows, state.located = None, None

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, uri: Any) -> bool:
        return uri in self._states


__all__ = ["ROWS_BUDGET_BYTES", "Located", "TableState", "TableStates"]
