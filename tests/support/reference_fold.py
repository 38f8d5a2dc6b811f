"""Folding one stream micro-batch of one table into the upserts and deletes a sink applies.

A micro-batch holds the changes of one table in binlog order. A sink applies it as one MERGE
(docs/architecture.md, "The sink"), and a MERGE needs at most one source row per key: two source rows for one key
either make the MERGE fail (both match) or insert the key twice (neither matches). So the batch is
folded first: every key it touches ends as exactly one upsert (its last after-image) or one delete.

Keys are compared by **exact value** (binary identity: ``'a' != 'A' != 'a '``), not by the source
collation. That is right here, unlike in the snapshot window merge (``changes.last_change_per_key``
with a collation-aware ``normalize``): in the stream every before-image carries the key exactly as
the row is stored, which is exactly what the sink holds (the snapshot wrote the stored value, and
every later upsert wrote the stored after-image). So an ``'a'`` deleted and an ``'A'`` inserted under
a case-insensitive collation are two sink rows — delete one, upsert the other — and the order of
the two operations inside the MERGE does not matter because they touch different rows.

Pure logic: no I/O, no Airflow; Spark workers import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.core.change import CREATE, DELETE, UPDATE

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


__all__ = ["Change", "Key", "fold_changes", "keys_to_arrow"]
