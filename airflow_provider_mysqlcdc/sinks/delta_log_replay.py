"""The live add actions of a Delta table exactly as its log holds them, deletion vectors included.

Why: a commit that changes a file's deletion vector must remove the file *with the vector it has
now* (the protocol identifies a live file by its path and its vector), and delta-rs' Python API
shows neither the vectors nor the raw statistics. This replays the log itself — the last
checkpoint, then every JSON entry after it — keeping only what such a commit needs: each live
file's add action, the protocol, the metadata and the application transactions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from airflow_provider_mysqlcdc import storage as lake_storage


@dataclass
class LogSnapshot:
    """A table at ``version`` as its log says: live add actions by path, protocol, metadata, txns."""

    version: int
    adds: dict[str, dict[str, Any]] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    transactions: dict[str, int] = field(default_factory=dict)

    @property
    def configuration(self) -> dict[str, str]:
        return dict(self.metadata.get("configuration") or {})

    def apply(self, action: dict[str, Any]) -> None:
        if action.get("add"):
            add = action["add"]
            self.adds[add["path"]] = add
        elif action.get("remove"):
            self.adds.pop(action["remove"]["path"], None)
        elif action.get("metaData"):
            self.metadata = action["metaData"]
        elif action.get("protocol"):
            self.protocol = action["protocol"]
        elif action.get("txn"):
            self.transactions[action["txn"]["appId"]] = int(action["txn"]["version"])

    def has_feature(self, name: str) -> bool:
        features = (*(self.protocol.get("readerFeatures") or ()), *(self.protocol.get("writerFeatures") or ()))
        return name in features


def replay(storage: lake_storage.LakeStorage, table_uri: str) -> LogSnapshot:
    """The table at ``table_uri`` at its latest version (raises FileNotFoundError if it has no log)."""
    log_dir = f"{table_uri.rstrip('/')}/_delta_log"
    names = storage.listdir(log_dir)
    versions = sorted(int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit() and len(n) == 25)
    if not versions:
        raise FileNotFoundError(f"{table_uri} has no Delta log")
    start = -1
    snapshot = LogSnapshot(version=versions[-1])
    checkpoints = _checkpoint_parts(names)
    usable = [v for v in checkpoints if v <= versions[-1]]
    if usable:
        start = max(usable)
        for part in checkpoints[start]:
            _read_checkpoint(storage, f"{log_dir}/{part}", snapshot)
    for v in versions:
        if v <= start:
            continue
        with storage.open(f"{log_dir}/{v:020d}.json", "rb") as f:
            for line in f.read().splitlines():
                if line.strip():
                    snapshot.apply(json.loads(line))
    return snapshot


def _checkpoint_parts(names: list[str]) -> dict[int, list[str]]:
    """Complete checkpoints by version: single-file and multi-part (``.checkpoint.i.n.parquet``)."""
    parts: dict[int, list[str]] = {}
    wanted: dict[int, int] = {}
    for n in names:
        if ".checkpoint." not in n or not n.endswith(".parquet") or not n[:20].isdigit():
            continue
        v = int(n[:20])
        fields = n[21:].split(".")  # checkpoint[.i.n].parquet
        if len(fields) == 2:
            parts.setdefault(v, []).append(n)
            wanted[v] = 1
        elif len(fields) == 4 and fields[1].isdigit() and fields[2].isdigit():
            parts.setdefault(v, []).append(n)
            wanted[v] = int(fields[2])
    return {v: sorted(p) for v, p in parts.items() if len(p) == wanted[v]}


def _read_checkpoint(storage: lake_storage.LakeStorage, url: str, snapshot: LogSnapshot) -> None:
    with storage.open(url, "rb") as f:
        data = pq.read_table(f)
    for name in ("protocol", "metaData", "txn", "add"):
        if name not in data.column_names:
            continue
        for value in data.column(name).to_pylist():
            if value is None:
                continue
            snapshot.apply({name: _plain(value)})


#: Action fields of Delta's map type (a checkpoint gives them as key/value pair lists).
MAP_FIELDS = frozenset({"partitionValues", "tags", "configuration", "options"})


def _plain(value: Any, name: str | None = None) -> Any:
    """A checkpoint's struct as the JSON entry's dict: maps as dicts, lists (``partitionColumns``)
    as lists, absent values left out."""
    if isinstance(value, dict):
        return {k: _plain(v, k) for k, v in value.items() if v is not None}
    if name in MAP_FIELDS and isinstance(value, list):
        return dict(value)
    return value


__all__ = ["LogSnapshot", "replay"]
