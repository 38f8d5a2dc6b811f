"""Spark's streaming checkpoint when the state store is on an object store: kept on the driver's
disk, copied into the state store.

Why: Spark writes its checkpoint through Hadoop's FileSystem API, which reaches S3, GCS or ADLS
only with a connector jar the cluster may not have (pyspark ships none). The checkpoint is a few
small files per micro-batch, so the driver keeps it on local disk and copies new files into the
state store (docs/architecture.md, "Object storage"):

* before a micro-batch touches any Delta table — ``offsets/<N>`` is then in the store, so a driver
  restarted on another machine replays batch N with the same offsets and the sink skips every
  table batch N already committed (the guarantee of a checkpoint written to the store directly);
* after the query stops (``commits/<N>``, read by hand-overs and the stream operator).

At start the driver restores its local copy from the store. A local state store keeps the
checkpoint in place and needs none of this.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from airflow_provider_mysqlcdc.state import StateStore

log = logging.getLogger(__name__)


class CheckpointCopy:
    """The local working copy of the checkpoint ``<state>/<rel>`` of an object-store state store."""

    def __init__(self, store: StateStore, rel: str, scratch_dir: str | None = None):
        self.store = store
        self.rel = rel.strip("/")
        if scratch_dir:
            os.makedirs(scratch_dir, exist_ok=True)
        self.local = tempfile.mkdtemp(prefix=f"mysqlcdc-checkpoint-{store.pipeline_id}-", dir=scratch_dir)
        self._copied: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) in the store

    def restore(self) -> int:
        """Fill the local copy from the store; returns the number of files restored."""
        remote = self.store.path(self.rel)
        try:
            found = self.store.fs.find(remote, withdirs=False)
        except FileNotFoundError:
            found = []
        for path in found:
            rel = path[len(remote) :].lstrip("/")
            if not rel or _skipped(rel):
                continue
            target = os.path.join(self.local, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with self.store.fs.open(path, "rb") as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            st = os.stat(target)
            self._copied[rel] = (st.st_size, st.st_mtime_ns)
        if found:
            log.info("checkpoint %s restored from the state store (%d files)", self.store.url(self.rel), len(found))
        return len(self._copied)

    def push(self) -> int:
        """Copy files that are new or changed since the last push; returns how many were copied.

        Commit markers go before offsets, so the store never holds an offsets entry that is newer
        than its predecessors' commit markers by more than one batch (Spark's own invariant)."""
        changed: list[tuple[str, tuple[int, int]]] = []
        for dirpath, _, names in os.walk(self.local):
            for name in names:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.local)
                if _skipped(rel):
                    continue
                st = os.stat(full)
                sig = (st.st_size, st.st_mtime_ns)
                if self._copied.get(rel) != sig:
                    changed.append((rel, sig))
        changed.sort(key=lambda item: (not item[0].startswith("commits"), item[0]))
        for rel, sig in changed:
            with open(os.path.join(self.local, rel), "rb") as src:
                data = src.read()
            target = self.store.path(self.rel, rel)
            with self.store.fs.open(target, "wb") as dst:  # one PUT: atomic on an object store
                dst.write(data)
            self._copied[rel] = sig
        return len(changed)

    def close(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)


def _skipped(rel: str) -> bool:
    """Hadoop's checksum files and Spark's temporary files are not part of the checkpoint."""
    name = rel.replace(os.sep, "/").rsplit("/", 1)[-1]
    return name.startswith(".") or name.endswith(".tmp")


__all__ = ["CheckpointCopy"]
