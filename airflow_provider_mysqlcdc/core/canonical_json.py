"""Canonical column values (``core/types.py``) in JSON, exactly, for records such as the manifest.

Why: JSON has no decimal, date, timestamp or bytes; a value the stream must reproduce bit for bit
(the value an ``ADD COLUMN ... DEFAULT`` gave the existing rows) is written as a one-key object
naming its form, and read back as the same Python value. Pure.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any


def to_json(value: Any) -> Any:
    """A JSON-safe form of one canonical value (None, bool, int, float, str pass as they are)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Decimal):
        return {"decimal": format(value, "f")}
    if isinstance(value, dt.datetime):
        return {"timestamp": value.astimezone(dt.UTC).isoformat()}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    if isinstance(value, bytes | bytearray):
        return {"hex": bytes(value).hex()}
    raise TypeError(f"no JSON form for a canonical value of type {type(value).__name__}: {value!r}")


def from_json(value: Any) -> Any:
    """The canonical value :func:`to_json` wrote."""
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"not a canonical value written by to_json: {value!r}")
    (form, text), = value.items()
    if form == "decimal":
        return Decimal(text)
    if form == "timestamp":
        return dt.datetime.fromisoformat(text)
    if form == "date":
        return dt.date.fromisoformat(text)
    if form == "hex":
        return bytes.fromhex(text)
    raise ValueError(f"not a canonical value written by to_json: {value!r}")


__all__ = ["from_json", "to_json"]
