"""Files a small table's own commits superseded, deleted once their grace has passed.

Why: a small table taking a batch by the whole-table rewrite supersedes all of its data every
batch; kept for the vacuum retention (an hour), one second's batches each leave a copy of the
table, and a 1.6 MB table grew the lake by gigabytes an hour (issue 33). The stream knows exactly
which files each of its commits removed, so it deletes them itself ``retention_seconds`` after that
commit — the grace a reader holding an older version has to read them — instead of waiting for the
hourly vacuum. Whether the copy a table's last whole rewrite superseded is still within its grace
decides whether its next batch may rewrite it whole again (:mod:`~airflow_provider_mysqlcdc.sinks.delta_small_marks`,
docs/architecture.md, "Committing small tables": *Disk*).

A file is deleted only when it is not live in the table as its writer knows it then (a table
restored to an older version would hold it again). Entries live in memory: after a restart the
files superseded within the last grace are left to the maintenance vacuum.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from airflow_provider_mysqlcdc import storage as lake_storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Superseded:
    """One file a commit removed: due for deletion at ``due`` (clock seconds)."""

    due: float
    uri: str  # the Delta table
    rel: str  # the file, relative to the table (as its log names it)
    size: int
    data: bool  # a data file (False: a deletion vector file)


class SupersededFiles:
    """The superseded files of the tables a sink writes, by table key (a table's URI, a routed
    shard's URI and shard), awaiting ``retention_seconds`` before they are deleted. Thread-safe:
    a batch's tables are applied by several threads."""

    def __init__(self, retention_seconds: float, clock: Callable[[], float] = time.time):
        if retention_seconds <= 0:
            raise ValueError(f"the retention of superseded files must be positive, got {retention_seconds}")
        self.retention_seconds = float(retention_seconds)
        self.clock = clock
        self._by_key: dict[str, list[Superseded]] = {}
        self._rewritten: dict[str, float] = {}  # key -> until when its last whole rewrite's copy is kept
        self._lock = threading.Lock()
        self.deleted_files = 0
        self.deleted_bytes = 0

    def add(self, key: str, uri: str, files: Mapping[str, int], data: bool) -> None:
        """``files`` (relative path -> bytes) of the table at ``uri`` were superseded just now."""
        if not files:
            return
        due = self.clock() + self.retention_seconds
        with self._lock:
            self._by_key.setdefault(key, []).extend(Superseded(due, uri, rel, int(n), data) for rel, n in files.items())

    def rewrote(self, key: str) -> None:
        """``key``'s table was just rewritten whole: the copy it superseded is kept for its grace."""
        with self._lock:
            self._rewritten[key] = self.clock() + self.retention_seconds

    def rewrite_held(self, key: str) -> bool:
        """Whether the copy ``key``'s last whole rewrite superseded is still within its grace: another
        whole rewrite now would keep a second one."""
        with self._lock:
            return self._rewritten.get(key, 0.0) > self.clock()

    def pending_data_bytes(self, key: str) -> int:
        """Bytes of ``key``'s superseded data files still within their grace."""
        now = self.clock()
        with self._lock:
            return sum(e.size for e in self._by_key.get(key, ()) if e.data and e.due > now)

    def due_keys(self) -> dict[str, str]:
        """Keys with a file whose grace has passed, with their table's URI."""
        now = self.clock()
        with self._lock:
            return {k: entries[0].uri for k, entries in self._by_key.items() if entries and entries[0].due <= now}

    def sweep(self, storage: lake_storage.LakeStorage, key: str, live: Container[str]) -> int:
        """Delete ``key``'s files whose grace has passed, except those in ``live`` (the table's live
        data and vector files now: such a file is dropped from the queue, not deleted); the number
        deleted."""
        now = self.clock()
        with self._lock:
            entries = self._by_key.get(key, [])
            cut = 0
            while cut < len(entries) and entries[cut].due <= now:
                cut += 1
            due, self._by_key[key] = entries[:cut], entries[cut:]
            if not self._by_key[key]:
                del self._by_key[key]
        deleted = 0
        for e in due:
            if e.rel in live:
                continue
            storage.remove(f"{e.uri.rstrip('/')}/{unquote(e.rel)}")
            deleted += 1
            with self._lock:
                self.deleted_files += 1
                self.deleted_bytes += e.size
        if deleted:
            log.debug("%s: deleted %d superseded file(s) past their %.0fs grace", key, deleted,
                      self.retention_seconds)  # fmt: skip
        return deleted

    def forget(self, key: str) -> None:
        with self._lock:
            self._by_key.pop(key, None)
            self._rewritten.pop(key, None)

    @property
    def waiting(self) -> int:
        """Files awaiting deletion (not ``__len__``: an empty queue is still a queue)."""
        with self._lock:
            return sum(len(v) for v in self._by_key.values())


__all__ = ["Superseded", "SupersededFiles"]
