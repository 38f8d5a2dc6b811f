"""Full-row-image detection of rows events: MariaDB pads a column bitmap's unused bits with 0,
MySQL (seen on 9.7) with 1; both mean "every column", and a missing column is refused on both."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_mysqlcdc.mysql.server import BinlogReadError
from airflow_provider_mysqlcdc.mysql.table_maps import TableMaps


def _event(ncols: int, present: bytes, present2: bytes | None = None) -> Any:
    row = {"values": {"k": 1}, "before_values": {"k": 1}, "after_values": {"k": 2}}
    return SimpleNamespace(
        number_of_columns=ncols, columns_present_bitmap=present, columns_present_bitmap2=present2,
        table_id=7, rows=[row],
    )  # fmt: skip


def _images(ev: Any, op: str) -> list[Any]:
    return TableMaps(None, {}, {}, {}, None).images(ev, "d.t", op, "mysql-bin.000001", 4)


@pytest.mark.parametrize(
    ("ncols", "bitmap"),
    [
        (2, b"\x03"),  # MariaDB: unused bits 0
        (2, b"\xff"),  # MySQL 9.7: unused bits 1
        (9, b"\xff\x01"),
        (9, b"\xff\xff"),
        (8, b"\xff"),
    ],
)
def test_full_images_are_accepted_whatever_the_padding(ncols: int, bitmap: bytes) -> None:
    assert _images(_event(ncols, bitmap), "c") == [{"k": 1}]
    assert _images(_event(ncols, bitmap, bitmap), "u") == [({"k": 1}, {"k": 2})]


@pytest.mark.parametrize(("ncols", "bitmap"), [(2, b"\x01"), (2, b"\xfd"), (9, b"\xff\xfe"), (9, b"\x7f\x01")])
def test_a_missing_column_is_refused_whatever_the_padding(ncols: int, bitmap: bytes) -> None:
    full = b"\xff" * len(bitmap)
    with pytest.raises(BinlogReadError, match="binlog_row_image=FULL"):
        _images(_event(ncols, bitmap), "d")
    with pytest.raises(BinlogReadError, match="binlog_row_image=FULL"):
        _images(_event(ncols, full, bitmap), "u")
