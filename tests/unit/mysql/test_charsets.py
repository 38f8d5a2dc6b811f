"""How a learned character set table reads a value: as the server's conversion walks it."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.mysql.charsets import CharsetTable, UnsupportedCharset, text_decoder, unsupported_reason


def _single(overrides: dict[int, str]) -> tuple[str, ...]:
    return tuple(overrides.get(i, chr(i) if i < 0x80 else "?") for i in range(256))


def test_a_single_byte_table_maps_every_byte_including_ascii_positions() -> None:
    # swe7-like: letters on ASCII's brackets; 0x80 undefined stays '?'
    dec = CharsetTable("x", _single({0x5B: "Ä", 0x81: "ü"}), {}).decoder()
    assert dec(b"a[b\x81\x80") == "aÄbü?"


def test_a_multi_byte_table_takes_known_sequences_and_reads_other_bytes_alone() -> None:
    multi = {b"\x81\x40": "　", b"\x81\x5c": "―", b"\x8f\xa1\xa1": "丂"}
    dec = CharsetTable("x", _single({0xA1: "｡"}), multi).decoder()
    # a trail byte in ASCII's range belongs to its lead; an unknown pair is the lead's '?' then the byte
    assert dec(b"a\x81\x40\x81\x5c\xa1") == "a　―｡"
    assert dec(b"\x81\x20b") == "? b"
    assert dec(b"\x8f\xa1\xa1\x8f") == "丂?"
    assert dec(b"plain") == "plain"


def test_unicode_sets_use_their_encoding_and_gb18030_is_refused_by_name() -> None:
    assert text_decoder("utf16")("é😀".encode("utf-16-be")) == "é😀"
    assert text_decoder("utf32")("z".encode("utf-32-be")) == "z"
    assert text_decoder("latin1")(b"\x80\x81") == "€\x81"
    assert unsupported_reason("utf8mb4") is None
    assert "gb18030" in (unsupported_reason("gb18030") or "")
    with pytest.raises(UnsupportedCharset, match="four-byte"):
        text_decoder("gb18030")
