"""Where each live row of a big table lies: key -> (data file, row position), kept by the stream.

Why: marking a changed row deleted with a deletion vector needs its file and position. Finding
them by reading the key columns of every file per batch would cost what a copy-on-write MERGE
costs. The stream reads the keys once, when it starts applying to the table, and then keeps the
index itself: the rows it deletes leave it, the rows it writes enter it.

The index is a sorted base (numpy arrays: key, file number, position, live flag) built from the
table's files, plus an overlay of the rows this stream wrote since, which is folded into the base
when it grows. Keys are one integer column (the tables that take deletion vectors:
:func:`~airflow_provider_mysqlcdc.sinks.delta_dv_table.deletion_vector_blocker`). Pure logic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Overlay entries folded into the sorted base once there are this many.
OVERLAY_FOLD_AT = 1_000_000


class DuplicateKeyError(RuntimeError):
    """Two live rows of the table carry the same key: the table is not what the stream wrote."""


@dataclass
class Located:
    """Where the asked keys lie: ``found`` marks those with a live row, at ``file_no``/``position``."""

    found: np.ndarray
    file_no: np.ndarray
    position: np.ndarray


class KeyIndex:
    """key -> (file number, row position) of every live row; file numbers index :attr:`files`."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self._file_of: dict[str, int] = {}
        self._keys = np.zeros(0, dtype=np.int64)
        self._file_no = np.zeros(0, dtype=np.int32)
        self._pos = np.zeros(0, dtype=np.uint32)
        self._live = np.zeros(0, dtype=bool)
        self._overlay: dict[int, tuple[int, int]] = {}

    @classmethod
    def build(cls, files: dict[str, tuple[np.ndarray, np.ndarray]]) -> KeyIndex:
        """The index of ``files``: path -> (keys of its live rows, their positions in the file)."""
        index = cls()
        keys, file_no, pos = [], [], []
        for path, (k, p) in files.items():
            n = index.file_number(path)
            keys.append(np.asarray(k, dtype=np.int64))
            pos.append(np.asarray(p, dtype=np.uint32))
            file_no.append(np.full(len(k), n, dtype=np.int32))
        if keys:
            index._set_base(np.concatenate(keys), np.concatenate(file_no), np.concatenate(pos))
        return index

    def _set_base(self, keys: np.ndarray, file_no: np.ndarray, pos: np.ndarray) -> None:
        order = np.argsort(keys, kind="stable")
        self._keys, self._file_no, self._pos = keys[order], file_no[order], pos[order]
        self._live = np.ones(len(keys), dtype=bool)
        if len(keys) > 1:
            dup = np.flatnonzero(self._keys[1:] == self._keys[:-1])
            if len(dup):
                k = int(self._keys[dup[0]])
                a, b = self.files[self._file_no[dup[0]]], self.files[self._file_no[dup[0] + 1]]
                raise DuplicateKeyError(f"key {k} is live twice in the table (files {a} and {b})")

    def file_number(self, path: str) -> int:
        n = self._file_of.get(path)
        if n is None:
            n = self._file_of[path] = len(self.files)
            self.files.append(path)
        return n

    def __len__(self) -> int:
        return int(self._live.sum()) + len(self._overlay)

    @property
    def overlay_size(self) -> int:
        return len(self._overlay)

    def locate(self, keys: np.ndarray) -> Located:
        """Where each of ``keys`` (distinct) lies now."""
        keys = np.asarray(keys, dtype=np.int64)
        found = np.zeros(len(keys), dtype=bool)
        file_no = np.full(len(keys), -1, dtype=np.int32)
        position = np.full(len(keys), -1, dtype=np.int64)
        if len(self._keys) and len(keys):
            at = np.searchsorted(self._keys, keys)
            inside = at < len(self._keys)
            hit = np.zeros(len(keys), dtype=bool)
            hit[inside] = (self._keys[at[inside]] == keys[inside]) & self._live[at[inside]]
            found[hit], file_no[hit], position[hit] = True, self._file_no[at[hit]], self._pos[at[hit]]
        if self._overlay:
            for i, k in enumerate(keys.tolist()):
                where = self._overlay.get(k)
                if where is not None:
                    found[i], file_no[i], position[i] = True, where[0], where[1]
        return Located(found, file_no, position)

    def forget(self, keys: np.ndarray) -> None:
        """The rows of ``keys`` are deleted (their files' vectors mark them)."""
        keys = np.asarray(keys, dtype=np.int64)
        if len(self._keys) and len(keys):
            at = np.searchsorted(self._keys, keys)
            inside = at < len(self._keys)
            hit = at[inside][self._keys[at[inside]] == keys[inside]]
            self._live[hit] = False
        if self._overlay:
            for k in keys.tolist():
                self._overlay.pop(k, None)

    def add_file(self, path: str, keys: np.ndarray) -> None:
        """A new file of the table holds ``keys`` at positions 0..n-1 (none of them live elsewhere)."""
        n = self.file_number(path)
        for p, k in enumerate(np.asarray(keys, dtype=np.int64).tolist()):
            self._overlay[k] = (n, p)
        if len(self._overlay) >= OVERLAY_FOLD_AT:
            self.fold_overlay()

    def drop_files(self, paths: set[str]) -> None:
        """Rows of ``paths`` leave the index (the files were compacted away; their rows re-enter
        through :meth:`add_file` under the new file's name)."""
        numbers = np.asarray([self._file_of[p] for p in paths if p in self._file_of], dtype=np.int32)
        if not len(numbers):
            return
        self._live[np.isin(self._file_no, numbers)] = False
        gone = set(numbers.tolist())
        self._overlay = {k: v for k, v in self._overlay.items() if v[0] not in gone}

    def fold_overlay(self) -> None:
        """Fold the overlay into the sorted base (and drop the base's dead entries)."""
        live = self._live
        ov = np.fromiter(self._overlay.keys(), dtype=np.int64, count=len(self._overlay))
        where = np.asarray(list(self._overlay.values()), dtype=np.int64).reshape(-1, 2)
        self._overlay = {}
        self._set_base(np.concatenate([self._keys[live], ov]),
                       np.concatenate([self._file_no[live], where[:, 0].astype(np.int32)]),
                       np.concatenate([self._pos[live], where[:, 1].astype(np.uint32)]))  # fmt: skip

    def rows_of(self, path: str) -> int:
        """Live rows the index places in ``path``."""
        n = self._file_of.get(path)
        if n is None:
            return 0
        base = int((self._live & (self._file_no == n)).sum())
        return base + sum(1 for v in self._overlay.values() if v[0] == n)


__all__ = ["OVERLAY_FOLD_AT", "DuplicateKeyError", "KeyIndex", "Located"]
