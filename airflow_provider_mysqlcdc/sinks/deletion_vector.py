"""Delta deletion vectors: which rows of a data file are deleted, as the Delta protocol stores them.

Why: a stream batch that changes a few hundred rows spread over a big table would otherwise
rewrite every file holding one of them (copy-on-write) — the whole table, every batch. A deletion
vector marks those rows deleted in place; the batch writes only the changed rows and one small
vector file (docs/architecture.md, "Big tables: deletion vectors").

The format (Delta PROTOCOL.md, "Deletion Vector Format"): a ``RoaringBitmapArray`` — magic
``1681511377``, the number of 32-bit bitmaps, then each bitmap's high 32 bits and its portable
Roaring serialization, all little-endian — stored in a vector file (a version byte, then per vector
its size, the bytes and their CRC-32, big-endian) named ``deletion_vector_<uuid>.bin`` and referred
to by Z85 of the UUID (storage type ``u``), or inline in the log (``i``, Z85 of the bytes).
Pure logic: no table, no file system.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroaring import BitMap

MAGIC = 1681511377
FILE_FORMAT_VERSION = 1
_Z85 = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


class DeletionVectorError(ValueError):
    """A deletion vector that cannot be read (corrupt bytes, an unknown storage type)."""


def z85_encode(data: bytes) -> str:
    """Z85 of ``data`` (zero-padded to a multiple of 4 bytes, as Delta does)."""
    data = data + b"\0" * (-len(data) % 4)
    out = bytearray()
    for (word,) in struct.iter_unpack(">I", data):
        chunk = bytearray(5)
        for i in range(4, -1, -1):
            word, chunk[i] = divmod(word, 85)
        out += bytes(_Z85[c] for c in chunk)
    return out.decode("ascii")


def z85_decode(text: str, size: int | None = None) -> bytes:
    """The bytes of Z85 ``text``; ``size``: the length before padding."""
    raw = text.encode("ascii")
    if len(raw) % 5:
        raise DeletionVectorError(f"Z85 text of length {len(raw)} is not a multiple of 5")
    out = bytearray()
    for i in range(0, len(raw), 5):
        word = 0
        for c in raw[i : i + 5]:
            try:
                word = word * 85 + _Z85_INDEX[c]
            except KeyError:
                raise DeletionVectorError(f"{chr(c)!r} is not a Z85 character") from None
        out += struct.pack(">I", word)
    return bytes(out[:size] if size is not None else out)


def serialize(rows: BitMap) -> bytes:
    """A file's deleted row positions as a ``RoaringBitmapArray`` (positions fit 32 bits: a Parquet
    file of more than 4 billion rows is refused)."""
    if len(rows) and rows.max() >= 1 << 32:
        raise DeletionVectorError("a data file of more than 2**32 rows cannot take a 32-bit deletion vector")
    body = rows.serialize()
    return struct.pack("<iq", MAGIC, 1) + struct.pack("<i", 0) + body


def deserialize(data: bytes) -> BitMap:
    """The row positions of a ``RoaringBitmapArray`` (bitmaps above the first 2**32 rows refused)."""
    if len(data) < 12:
        raise DeletionVectorError(f"a deletion vector of {len(data)} bytes is too short")
    magic, count = struct.unpack_from("<iq", data, 0)
    if magic != MAGIC:
        raise DeletionVectorError(f"deletion vector magic {magic}, expected {MAGIC}")
    rows = BitMap()
    offset = 12
    for _ in range(count):
        (high,) = struct.unpack_from("<i", data, offset)
        offset += 4
        part = BitMap.deserialize(data[offset:])
        offset += len(part.serialize())
        if high != 0 and len(part):
            raise DeletionVectorError("deletion vectors of files above 2**32 rows are not supported")
        rows |= part
    return rows


@dataclass(frozen=True)
class VectorSlot:
    """One vector's place in a vector file: its offset and serialized size."""

    offset: int
    size: int


class VectorFileBuilder:
    """The bytes of one deletion vector file holding many vectors (one per data file of a commit)."""

    def __init__(self) -> None:
        self.uuid = uuid.uuid4()
        self._data = bytearray([FILE_FORMAT_VERSION])

    @property
    def name(self) -> str:
        return f"deletion_vector_{self.uuid}.bin"

    def append(self, rows: BitMap) -> VectorSlot:
        body = serialize(rows)
        offset = len(self._data)
        self._data += struct.pack(">i", len(body)) + body + struct.pack(">I", zlib.crc32(body))
        return VectorSlot(offset, len(body))

    def descriptor(self, slot: VectorSlot, cardinality: int) -> dict[str, Any]:
        """The ``deletionVector`` of an add action naming ``slot`` (no path prefix: the vector file
        lies in the table's root directory)."""
        return {"storageType": "u", "pathOrInlineDv": z85_encode(self.uuid.bytes), "offset": slot.offset,
                "sizeInBytes": slot.size, "cardinality": int(cardinality)}  # fmt: skip

    def getvalue(self) -> bytes:
        return bytes(self._data)


def vector_location(descriptor: Mapping[str, Any]) -> str | None:
    """Where the vector of ``descriptor`` lies: a path relative to the table (``u``), an absolute
    path (``p``), or None when it is inline (``i``)."""
    kind = descriptor["storageType"]
    text = descriptor["pathOrInlineDv"]
    if kind == "i":
        return None
    if kind == "p":
        return str(text)
    if kind == "u":
        prefix, encoded = text[:-20], text[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded, 16))}.bin"
        return f"{prefix}/{name}" if prefix else name
    raise DeletionVectorError(f"unknown deletion vector storage type {kind!r}")


def read_vector(descriptor: Mapping[str, Any], file_bytes: bytes | None) -> BitMap:
    """The deleted rows ``descriptor`` names; ``file_bytes``: its vector file's bytes (None inline)."""
    size = int(descriptor["sizeInBytes"])
    if descriptor["storageType"] == "i":
        return deserialize(z85_decode(descriptor["pathOrInlineDv"], size))
    if file_bytes is None:
        raise DeletionVectorError("the vector file's bytes are needed for a stored deletion vector")
    offset = int(descriptor.get("offset") or 1)
    (stored,) = struct.unpack_from(">i", file_bytes, offset)
    if stored != size:
        raise DeletionVectorError(f"deletion vector at offset {offset} holds {stored} bytes, descriptor says {size}")
    body = file_bytes[offset + 4 : offset + 4 + size]
    (crc,) = struct.unpack_from(">I", file_bytes, offset + 4 + size)
    if zlib.crc32(body) != crc:
        raise DeletionVectorError(f"deletion vector at offset {offset}: checksum mismatch")
    rows = deserialize(body)
    if len(rows) != int(descriptor.get("cardinality", len(rows))):
        raise DeletionVectorError("deletion vector cardinality differs from its descriptor")
    return rows


def keep_mask(rows: int, deleted: BitMap) -> np.ndarray:
    """A boolean mask of the ``rows`` rows of a file that ``deleted`` leaves live."""
    mask = np.ones(rows, dtype=bool)
    if len(deleted):
        mask[np.asarray(deleted.to_array(), dtype=np.int64)] = False
    return mask


__all__ = [
    "DeletionVectorError",
    "VectorFileBuilder",
    "VectorSlot",
    "deserialize",
    "keep_mask",
    "read_vector",
    "serialize",
    "vector_location",
    "z85_decode",
    "z85_encode",
]
