"""Set a Delta table's properties, re-reading the table after a concurrent commit.

Why its own helper: the owner claim and the statistics declaration (``sinks/delta.py``) both change
a table property while other groups of the same snapshot may commit to the same table; each must
decide again on the table as it is after such a commit, and give up with one clear error.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from airflow_provider_mysqlcdc.sinks.delta_merge import COMMIT_ATTEMPTS


def set_table_properties(
    open_table: Callable[[], DeltaTable],
    wanted: Callable[[DeltaTable], dict[str, str] | None],
    what: str,
    opened: DeltaTable | None = None,
) -> bool:
    """Set the properties ``wanted(table)`` asks for (None: nothing to change); True if a commit was
    made. ``opened``: the table, just loaded (read again only after a conflict); ``what`` names the
    change in the error after ``COMMIT_ATTEMPTS`` conflicts."""
    for attempt in range(COMMIT_ATTEMPTS):
        dt = opened if opened is not None and attempt == 0 else open_table()
        properties = wanted(dt)
        if properties is None:
            return False
        try:
            dt.alter.set_table_properties(properties, raise_if_not_exists=False)
        except CommitFailedError:
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        return True
    raise RuntimeError(f"could not {what}: {COMMIT_ATTEMPTS} attempts conflicted with other commits")


__all__ = ["set_table_properties"]
