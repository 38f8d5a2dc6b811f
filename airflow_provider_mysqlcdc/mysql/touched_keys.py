"""Which keys of some tables the binlog touched in a range, and where.

Why: a re-read (re-snapshot, repair) of a table with a changelog must tell a row the source lost
without a binlog event (a cascading foreign key, a write with ``sql_log_bin=0``) from one the
binlog changed between the re-read's high watermark and the stream's pause point — only the
first kind needs a ``d`` of its own in the changelog (``reread_changelog.py``). The read is
one-shot (``ONE_SHOT_SERVER_ID``): bounded, non-blocking, registered as no replica, so it runs
beside the stream and the snapshot groups.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_mysqlcdc.core.manifest import CapturedTable
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.row_digest import normal_key
from airflow_provider_mysqlcdc.mysql.binlog_reader import ONE_SHOT_SERVER_ID, BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings

#: table -> key tuple (``normal_key``) -> the offsets of the transactions that touched it
TouchedKeys = dict[str, dict[tuple[Any, ...], list[BinlogOffset]]]


def touched_keys(
    settings: ConnectionSettings,
    entries: Mapping[str, CapturedTable],
    key_columns: Mapping[str, Sequence[str]],
    start: BinlogOffset,
    end: BinlogOffset,
) -> TouchedKeys:
    """The ``key_columns`` tuples of every before and after image of the ``entries``' tables in
    ``[start, end)``, each with the start offsets of the transactions that touched it."""
    out: TouchedKeys = {t: defaultdict(list) for t in entries}
    if not start < end:
        return out
    schemas = {t: e.schema for t, e in entries.items()}
    optional = {t: e.optional_columns for t, e in entries.items()}
    with BinlogRangeReader(settings, start, end, list(entries), ONE_SHOT_SERVER_ID, schemas=schemas,
                           added_columns=optional) as reader:  # fmt: skip
        for change in reader:
            cols = key_columns[change.table]
            for image in (change.before, change.after):
                if image is not None:
                    out[change.table][normal_key(image[c] for c in cols)].append(change.tx_offset)
    return out


__all__ = ["TouchedKeys", "touched_keys"]
