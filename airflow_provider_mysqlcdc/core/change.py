"""Row changes decoded from the binlog, one :class:`RowChange` per changed row.

A :class:`RowChange` is one row of one rows event. Two positions travel with it, for two different
jobs:

* ``tx_offset`` — where the change's *transaction starts* (the start of its GTID event, or of its
  ``BEGIN`` when the server writes no GTID event). That is exactly what ``SHOW MASTER STATUS``
  returned just before the transaction was written, so comparing it with a high watermark answers
  "was this committed after the HW snapshot?" (``tx_offset >= HW``) with no off-by-one: a
  transaction that ends exactly at HW starts before it and is excluded, the next one starts at or
  after it and is included (docs/architecture.md, "The handoff").
* ``event_pos`` + ``row_index`` — where the row itself sits, so that changes can be put back in
  binlog order after being decoded in parallel (``order_key`` is a total order).

A rows event's rows travel together as :class:`RowsEventChanges` from the reader to a consumer
that can take them at once (the stream's decoding task appends a whole event to its change block
when the handoff passes every row of it): one object per event instead of one per row is a large
part of the task's per-row cost. ``RowsEventChanges.changes()`` gives the rows one by one.

Folding changes to the last change per key is not done on these objects: the readers turn them
into Arrow change blocks, folded by :func:`~airflow_provider_mysqlcdc.core.change_block.fold_block`.

This module is pure: no I/O, no Airflow, importable by Spark workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from airflow_provider_mysqlcdc.core.offset import BinlogOffset

Op = Literal["c", "u", "d", "s"]  # "s": a DDL statement on the table (after = {"kind", "sql"})
CREATE: Op = "c"
UPDATE: Op = "u"
DELETE: Op = "d"


@dataclass(slots=True)
class RowChange:
    """One changed row: insert (``c``), update (``u``) or delete (``d``) of ``table``.

    ``before`` is None for inserts, ``after`` is None for deletes; both map column name -> value
    (raw python-mysql-replication values unless the reader was given a converter).
    ``commit_ts`` is the rows event's timestamp in epoch seconds (the statement's start time on the
    source; the binlog carries nothing finer).
    """

    op: Op
    table: str  # "db.table"
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    tx_offset: BinlogOffset
    event_pos: tuple[int, int]  # (binlog file number, start position of the rows event)
    row_index: int = 0  # index of the row within its rows event
    commit_ts: int = 0

    @property
    def order_key(self) -> tuple[int, int, int]:
        """Total binlog order: (file number, rows event position, row index within the event)."""
        return (self.event_pos[0], self.event_pos[1], self.row_index)

    @property
    def image(self) -> dict[str, Any]:
        """The row image that identifies the row after the change (the before image of a delete)."""
        img = self.after if self.after is not None else self.before
        if img is None:
            raise ValueError(f"row change of {self.table} at {self.event_pos} has neither a before nor an after image")
        return img

    def key(self, key_columns: Sequence[str], image: Literal["before", "after"] | None = None) -> tuple[Any, ...]:
        """The key tuple of the ``before``/``after`` image (default: :attr:`image`)."""
        img = self.image if image is None else (self.before if image == "before" else self.after)
        if img is None:
            raise ValueError(f"{self.op!r} change of {self.table} has no {image} image")
        try:
            return tuple(img[c] for c in key_columns)
        except KeyError as exc:
            raise KeyError(
                f"key column {exc.args[0]!r} is not in the row image of {self.table} (columns: {sorted(img)})"
            ) from None

    def halves(self, delete_half: bool, upsert_half: bool) -> RowChange | None:
        """An update reduced to the halves that pass, each judged by its own key's chunk: the update
        itself, its delete-half (a delete of the before image), its upsert-half (the update without
        its before image, so nothing is deleted), or None. Halves keep the change's binlog place."""
        if delete_half and upsert_half:
            return self
        if delete_half:
            return RowChange(DELETE, self.table, self.before, None, self.tx_offset, self.event_pos, self.row_index,
                             self.commit_ts)  # fmt: skip
        if upsert_half:
            return RowChange(UPDATE, self.table, None, self.after, self.tx_offset, self.event_pos, self.row_index,
                             self.commit_ts)  # fmt: skip
        return None


@dataclass(slots=True)
class RowsEventChanges:
    """The changed rows of one rows event, in row order.

    ``images``: the decoded row images (one per row for ``c`` and ``d``; ``(before, after)`` pairs
    for ``u``); ``first_row`` is the row index of ``images[0]`` within the event (rows a consumer
    already handled may be left out at the front).
    """

    op: Op
    table: str
    images: list[Any]
    tx_offset: BinlogOffset
    event_pos: tuple[int, int]
    commit_ts: int = 0
    first_row: int = 0

    def __len__(self) -> int:
        return len(self.images)

    def befores_afters(self) -> tuple[Sequence[Any], Sequence[Any]]:
        """The rows' before and after images as two sequences (None where the op has no such image)."""
        images = self.images
        if self.op == UPDATE:
            if not images:
                return (), ()
            befores, afters = zip(*images, strict=True)
            return befores, afters
        if self.op == CREATE:
            return [None] * len(images), images
        return images, [None] * len(images)

    def changes(self) -> Iterator[RowChange]:
        """The rows one by one."""
        op, table, tx, at, ts = self.op, self.table, self.tx_offset, self.event_pos, self.commit_ts
        if op == UPDATE:
            for i, (before, after) in enumerate(self.images, self.first_row):
                yield RowChange(op, table, before, after, tx, at, i, ts)
        elif op == CREATE:
            for i, after in enumerate(self.images, self.first_row):
                yield RowChange(op, table, None, after, tx, at, i, ts)
        else:
            for i, before in enumerate(self.images, self.first_row):
                yield RowChange(op, table, before, None, tx, at, i, ts)

    def without_first(self, n: int) -> RowsEventChanges:
        """The event without its first ``n`` rows (handled before a connection broke)."""
        return RowsEventChanges(self.op, self.table, self.images[n:], self.tx_offset, self.event_pos, self.commit_ts,
                                self.first_row + n)  # fmt: skip
