"""Hash-partition primary keys into buckets, vectorised and the same for every process and run.

Why: a batch too large to fold in memory is folded bucket by bucket (``spill/bucketed_fold.py``),
and every change of a key — its insert, its updates, its delete, the delete-half of an update that
moved it — must land in the same bucket. Python's ``hash()`` is salted per process and costs a
Python call per key, and pyarrow has no scalar hash kernel, so the hash is computed here with numpy
over the Arrow buffers: 64-bit lanes of fixed-width values and a polynomial hash of the bytes of
variable-width ones, mixed with splitmix64. Equal values always hash equally; the spread only
matters for how even the buckets are.

Pure logic: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BYTE_BASE = np.uint64(0x100000001B3)  # FNV prime: the base of the polynomial string hash


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit affects every output bit."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _fixed_width_hash(arr: pa.Array) -> np.ndarray:
    """Hash of each value of a fixed-width array from its bytes (ints, floats, dates, decimals...)."""
    width = arr.type.bit_width // 8
    n = len(arr)
    buf = arr.buffers()[1]
    raw = np.frombuffer(buf, dtype=np.uint8, count=(arr.offset + n) * width)[arr.offset * width :]
    lanes = (width + 7) // 8
    if width % 8:
        padded = np.zeros((n, lanes * 8), dtype=np.uint8)
        padded[:, :width] = raw.reshape(n, width)
        raw = padded.reshape(-1)
    words = raw.view(np.uint64).reshape(n, lanes)
    h = np.zeros(n, dtype=np.uint64)
    for i in range(lanes):
        h = _mix(h ^ words[:, i])
    return h


def _bytes_hash(arr: pa.Array) -> np.ndarray:
    """Polynomial hash of the bytes of each value of a string/binary array, plus its length."""
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        offsets_type = np.int64
    else:
        offsets_type = np.int32
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=offsets_type, count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
    starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
    total = int(lengths.sum())
    h = lengths.astype(np.uint64)
    if total:
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        lo, hi = int(starts[0]), int(ends[-1])
        seg = data[lo:hi].astype(np.uint64)
        rel_starts = starts - lo
        # position of each byte inside its value: 0, 1, ... restarting at every value
        pos = np.arange(hi - lo, dtype=np.int64) - np.repeat(rel_starts, lengths)
        powers = _powers(int(lengths.max()))
        contrib = seg * powers[pos]
        nonempty = lengths > 0
        sums = np.zeros(n, dtype=np.uint64)
        sums[nonempty] = np.add.reduceat(contrib, rel_starts[nonempty])
        h = _mix(h ^ sums)
    return _mix(h)


_POWERS_CACHE: list[np.ndarray] = [np.ones(1, dtype=np.uint64)]


def _powers(length: int) -> np.ndarray:
    cached = _POWERS_CACHE[0]
    if len(cached) < length:
        out = np.empty(max(length, 2 * len(cached)), dtype=np.uint64)
        acc = np.uint64(1)
        with np.errstate(over="ignore"):
            for i in range(len(out)):
                out[i] = acc
                acc = acc * _BYTE_BASE
        _POWERS_CACHE[0] = cached = out
    return cached


def _column_hash(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_string_view(t):
        arr, t = arr.cast(pa.string()), pa.string()
    elif pa.types.is_binary_view(t):
        arr, t = arr.cast(pa.binary()), pa.binary()
    if pa.types.is_boolean(t):
        arr, t = arr.cast(pa.int8()), pa.int8()
    if arr.null_count == len(arr):
        return np.zeros(len(arr), dtype=np.uint64)  # absent images: callers mask them
    if _is_bytes(t):
        return _bytes_hash(arr)
    if pa.types.is_fixed_size_binary(t):
        arr = arr.cast(pa.binary())
        return _bytes_hash(arr)
    if getattr(t, "bit_width", 0) and t.bit_width % 8 == 0:
        return _fixed_width_hash(arr)
    # Anything else (nested types never are key columns): hash the text form.
    return _bytes_hash(arr.cast(pa.string()))


def _is_bytes(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)


def key_hash(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """A 64-bit hash per row of the key made of ``columns`` (equal keys, equal hashes)."""
    if not columns:
        raise ValueError("key_hash needs at least one key column")
    h: np.ndarray | None = None
    for col in columns:
        ch = _column_hash(col)
        h = ch if h is None else _mix(h * np.uint64(31) ^ ch)
    assert h is not None
    return h


def key_buckets(columns: Sequence[pa.Array | pa.ChunkedArray], buckets: int) -> np.ndarray:
    """The bucket (``0 .. buckets-1``) of each row's key; int32 numpy array."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    n = len(columns[0]) if columns else 0
    if buckets == 1:
        return np.zeros(n, dtype=np.int32)
    h = key_hash(columns)
    return ((h >> np.uint64(17)) % np.uint64(buckets)).astype(np.int32)


__all__ = ["key_buckets", "key_hash"]
