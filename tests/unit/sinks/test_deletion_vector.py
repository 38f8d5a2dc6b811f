"""Deletion vector bytes as the Delta protocol defines them, and the key index (plain data)."""

from __future__ import annotations

import random
import struct
import zlib

import numpy as np
import pytest
from pyroaring import BitMap

from airflow_provider_mysqlcdc.sinks.deletion_vector import (
    MAGIC,
    DeletionVectorError,
    VectorFileBuilder,
    deserialize,
    keep_mask,
    read_vector,
    serialize,
    vector_location,
    z85_decode,
    z85_encode,
)
from airflow_provider_mysqlcdc.sinks.delta_key_index import DuplicateKeyError, KeyIndex


def test_z85_matches_the_reference_vector_and_round_trips() -> None:
    # the Z85 specification's test vector (ZeroMQ RFC 32)
    assert z85_encode(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"
    rng = random.Random(1)
    for n in (0, 1, 3, 4, 16, 37):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert z85_decode(z85_encode(data), n) == data
    with pytest.raises(DeletionVectorError):
        z85_decode("abc")


def test_bitmap_array_layout_and_round_trip() -> None:
    rows = BitMap([0, 7, 65_535, 65_536, 1_000_000, *range(200_000, 210_000)])
    data = serialize(rows)
    magic, count, high = struct.unpack_from("<iqi", data, 0)
    assert (magic, count, high) == (MAGIC, 1, 0)
    assert deserialize(data) == rows
    with pytest.raises(DeletionVectorError):
        deserialize(b"\0" * 16)


def test_vector_file_slots_are_read_back_and_checked() -> None:
    builder = VectorFileBuilder()
    vectors = [BitMap([1, 3]), BitMap(range(0, 5000, 2)), BitMap()]
    descs = [builder.descriptor(builder.append(v), len(v)) for v in vectors]
    data = builder.getvalue()
    assert data[0] == 1  # the format version byte
    for v, d in zip(vectors, descs, strict=True):
        assert d["storageType"] == "u" and vector_location(d) == builder.name
        assert read_vector(d, data) == v
    # the size and CRC-32 framing: a flipped byte is caught
    off, size = descs[1]["offset"], descs[1]["sizeInBytes"]
    assert struct.unpack_from(">I", data, off + 4 + size)[0] == zlib.crc32(data[off + 4 : off + 4 + size])
    broken = bytearray(data)
    broken[off + 10] ^= 0xFF
    with pytest.raises(DeletionVectorError):
        read_vector(descs[1], bytes(broken))
    inline = {"storageType": "i", "pathOrInlineDv": z85_encode(serialize(vectors[0])),
              "sizeInBytes": len(serialize(vectors[0])), "cardinality": 2}  # fmt: skip
    assert read_vector(inline, None) == vectors[0] and vector_location(inline) is None
    assert vector_location({"storageType": "u", "pathOrInlineDv": "ab" + descs[0]["pathOrInlineDv"]}).startswith("ab/")
    assert list(keep_mask(5, BitMap([1, 3]))) == [True, False, True, False, True]


def test_key_index_follows_deletes_moves_and_new_files() -> None:
    index = KeyIndex.build({"a": (np.array([5, 1, 3]), np.array([0, 1, 2])),
                            "b": (np.array([10, 20]), np.array([0, 2]))})  # fmt: skip
    where = index.locate(np.array([1, 20, 4]))
    assert list(where.found) == [True, True, False]
    assert [index.files[n] for n in where.file_no[:2]] == ["a", "b"] and list(where.position[:2]) == [1, 2]
    index.forget(np.array([1, 20]))
    index.add_file("c", np.array([1, 4]))  # 1 re-written, 4 inserted
    where = index.locate(np.array([1, 4, 20, 5]))
    assert list(where.found) == [True, True, False, True]
    assert [index.files[n] for n in where.file_no[:2]] == ["c", "c"] and list(where.position[:2]) == [0, 1]
    assert len(index) == 5 and index.rows_of("c") == 2
    index.fold_overlay()
    assert len(index) == 5 and index.overlay_size == 0
    assert list(index.locate(np.array([4, 20])).found) == [True, False]
    index.drop_files({"c"})  # compacted away
    assert list(index.locate(np.array([1, 4, 3])).found) == [False, False, True]
    with pytest.raises(DuplicateKeyError):
        KeyIndex.build({"a": (np.array([1]), np.array([0])), "b": (np.array([1]), np.array([0]))})
