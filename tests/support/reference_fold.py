"""Reference folds: the last change per key, written plainly, to check the package's one fold.

The package folds with Arrow kernels (:func:`airflow_provider_mysqlcdc.core.change_block.fold_block`,
for the stream and the snapshot's binlog window alike); the folds here are independent of it, so
tests can compare the two (tests/unit/core/test_change_block.py) and read the final state of a reader's
changes (:func:`last_change_per_key`).

A micro-batch holds the changes of one table in binlog order. A sink applies it as one MERGE
(docs/architecture.md, "The sink"), and a MERGE needs at most one source row per key: two source
rows for one key either make the MERGE fail (both match) or insert the key twice (neither matches).
So the batch is folded first: every key it touches ends as exactly one upsert (its last
after-image) or one delete.

Keys are compared by **exact value** (binary identity: ``'a' != 'A' != 'a '``), not by the source
collation: in the stream every before-image carries the key exactly as the row is stored, which is
exactly what the sink holds (the snapshot wrote the stored value, and every later upsert wrote the
stored after-image). So an ``'a'`` deleted and an ``'A'`` inserted under a case-insensitive
collation are two sink rows — delete one, upsert the other — and the order of the two operations
inside the MERGE does not matter because they touch different rows.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.core.change import CREATE, DELETE, UPDATE, RowChange

#: ``(op, before, after)``: ``op`` is ``"c"`` (insert, ``before`` None), ``"u"`` (update, both
#: images) or ``"d"`` (delete, ``after`` None) — the images of :class:`~.changes.RowChange`.
Change = tuple[str, Mapping[str, Any] | None, Mapping[str, Any] | None]
Key = tuple[Any, ...]


def fold_changes(
    changes: Iterable[Change], primary_key: Sequence[str]
) -> tuple[list[dict[str, Any]], list[Key]]:
    """Fold ``changes`` (binlog order) into ``(upserts, delete_keys)``; the last change per key wins.

    * insert/update of key ``k`` -> ``k`` ends as an upsert of the after-image (an insert after a
      delete of ``k`` is an upsert: the row exists at the end of the batch);
    * delete of ``k`` -> ``k`` ends deleted (a delete after an insert of ``k`` is a delete: the row
      may already be in the sink from an earlier batch, and deleting a missing key is harmless);
    * an update that changes the key (``before`` key != ``after`` key) deletes the old key and
      upserts the new one — a later change of either key still overrides its part.

    Every key appears at most once in the result, in exactly one of the two lists, so the sink can
    apply both in one MERGE in any order. ``upserts`` are full rows (copies of the after-images, in
    the order of each key's last change); ``delete_keys`` are tuples in ``primary_key`` order.
    Keys are compared by exact value (see the module docstring for why no collation applies).

    Raises ``ValueError`` for an unknown op, a missing image, or an image without a key column:
    silently skipping such a change would leave the sink different from the source.
    """
    cols = tuple(primary_key)
    if not cols:
        raise ValueError("fold_changes needs the primary key columns: a table without a key cannot be merged")
    final: dict[Key, Any] = {}  # key -> after-image (upsert) or None (delete); order = last change

    def put(key: Key, row: Mapping[str, Any] | None) -> None:
        final.pop(key, None)  # re-insert so dict order follows each key's last change
        final[key] = None if row is None else dict(row)

    for i, change in enumerate(changes):
        op, before, after = change
        if op == CREATE:
            put(_key(after, cols, op, "after", i), after)
        elif op == UPDATE:
            old = _key(before, cols, op, "before", i)
            new = _key(after, cols, op, "after", i)
            if old != new:
                put(old, None)
            put(new, after)
        elif op == DELETE:
            put(_key(before, cols, op, "before", i), None)
        else:
            raise ValueError(f"change #{i} has unknown op {op!r} (expected 'c', 'u' or 'd')")

    upserts = [row for row in final.values() if row is not None]
    deletes = [key for key, row in final.items() if row is None]
    return upserts, deletes


def _key(image: Mapping[str, Any] | None, cols: tuple[str, ...], op: str, which: str, index: int) -> Key:
    if image is None:
        raise ValueError(f"change #{index} ({op!r}) has no {which} image")
    try:
        return tuple(image[c] for c in cols)
    except KeyError as exc:
        raise ValueError(
            f"change #{index} ({op!r}): key column {exc.args[0]!r} is missing from the {which} image "
            f"(columns: {sorted(image)})"
        ) from None


def keys_to_arrow(keys: Sequence[Key], primary_key: Sequence[str], schema: pa.Schema) -> pa.Table:
    """Delete keys as an Arrow table of the primary-key columns, typed as in the table ``schema``.

    The sink's MERGE joins on these columns, so they must carry the table's own types (an int64
    key compared with a float64 literal column would not use the key's file statistics).
    """
    fields = [schema.field(c) for c in primary_key]
    columns = [pa.array([k[i] for k in keys], type=f.type) for i, f in enumerate(fields)]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def last_change_per_key(
    changes: Iterable[RowChange],
    key_columns: Sequence[str],
    normalize: Callable[[tuple[Any, ...]], Hashable] | None = None,
) -> dict[Hashable, RowChange]:
    """Fold :class:`RowChange` objects (in binlog order) into the final change of every key they touched.

    A second reference form (tests read a reader's changes with it): on the objects the binlog
    readers yield, with an optional key normalisation the package's fold does not have.

    The value for a key is the change that decides its final state: if its ``after`` is None the
    key ends deleted, otherwise ``after`` is the key's final row. An update that changes the key is
    a delete of the old key plus an upsert of the new one (the old key maps to a synthesized ``d``
    change carrying the update's before image), so a row that moves out of a chunk disappears from
    it and a row that moves in appears (docs/architecture.md, "The watermark bracket").

    ``normalize`` maps a key tuple to the dict key. Pass the database's own key order (e.g. a
    collation-aware sort key) when keys are strings under a case- or pad-insensitive collation:
    there ``'a'`` and ``'A '`` are the same row, and folding them as different keys would apply a
    delete and an insert of one row in the wrong order. Default: the raw tuple.
    """
    norm: Callable[[tuple[Any, ...]], Hashable] = normalize if normalize is not None else _identity
    cols = tuple(key_columns)
    out: dict[Hashable, RowChange] = {}
    for ch in changes:
        if ch.op == UPDATE:
            old = norm(ch.key(cols, "before"))
            new = norm(ch.key(cols, "after"))
            if old != new:
                out[old] = RowChange(
                    DELETE, ch.table, ch.before, None, ch.tx_offset, ch.event_pos, ch.row_index, ch.commit_ts
                )
            out.pop(new, None)  # keep insertion order = order of the last change
            out[new] = ch
        elif ch.op == CREATE:
            k = norm(ch.key(cols, "after"))
            out.pop(k, None)
            out[k] = ch
        elif ch.op == DELETE:
            k = norm(ch.key(cols, "before"))
            out.pop(k, None)
            out[k] = ch
        else:
            raise ValueError(f"unknown row change op {ch.op!r} (expected 'c', 'u' or 'd')")
    return out


def _identity(key: tuple[Any, ...]) -> Hashable:
    return key


__all__ = ["Change", "Key", "fold_changes", "keys_to_arrow", "last_change_per_key"]
