"""Chunk-key values: their JSON form and their order *as the database orders them*.

Split boundaries are computed by the database, so its collation decides which chunk a string
key belongs to. A binlog event's key must be placed into the same chunk by Python, or a change
is applied to the wrong chunk (lost or duplicated: Flink CDC #2075 / PR #4413). This module turns a
key value into a sort key whose Python order equals the server's order:

* integers, decimals, floats, dates and datetimes compare natively;
* ``binary``/``varbinary`` compare as bytes (no padding);
* ``*_bin`` collations of UTF-8 compare by code point, other ``*_bin`` by encoded byte;
* a *simple* collation (one weight per character, no contractions: ``utf8mb4_general_ci``, the
  8-bit ``*_ci``; the server says so by ``SORTLEN`` 1) compares by the per-character weights the
  *server* reports (``WEIGHT_STRING``), fetched once per collation by the source layer;
* every other collation (UCA: ``utf8mb4_0900_ai_ci``, ``utf8mb4_uca1400_ai_ci``,
  ``utf8mb4_unicode_ci``, language tailorings with contractions, characters above U+FFFF) compares
  by the server's ``WEIGHT_STRING`` **of each whole value**, asked through a :class:`WeightSource`
  the source layer installs and kept in a cache: never a Python re-implementation that could
  silently disagree with the server (docs/architecture.md, "Servers and versions": *Collations*).

PAD SPACE collations (most of MySQL's) compare as if the shorter string were padded with spaces,
which is *not* the same as stripping trailing spaces ('a' > 'a\\t' because ' ' > '\\t');
:class:`PadSpaceKey` implements exactly that.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import total_ordering
from threading import Lock
from typing import Any, Protocol

# Kinds of chunk-key column, decided from the MySQL data type by the source layer.
INT = "int"
DECIMAL = "decimal"
FLOAT = "float"
STRING = "string"
BYTES = "bytes"
DATE = "date"
DATETIME = "datetime"
TIME = "time"  # the canonical text [-]HH:MM:SS[.f…], ordered by its signed length of time
BIT = "bit"  # the unsigned value (BIT(1)'s canonical boolean is 0 or 1)
KEY_KINDS = (INT, DECIMAL, FLOAT, STRING, BYTES, DATE, DATETIME, TIME, BIT)


def encode_key_value(kind: str, value: Any) -> Any:
    """A JSON-safe form of a key value (decimals as strings, bytes as base64)."""
    if value is None:
        return None
    if kind in (INT, BIT):
        return int(value)
    if kind == TIME:
        return time_text(value)
    if kind == DECIMAL:
        return str(value)
    if kind == FLOAT:
        return float(value)
    if kind == STRING:
        return str(value)
    if kind == BYTES:
        return base64.b64encode(bytes(value)).decode("ascii")
    if kind in (DATE, DATETIME):
        return value.isoformat()
    raise ValueError(f"unknown key kind {kind!r}")


def decode_key_value(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind in (INT, BIT):
        return int(value)
    if kind == TIME:
        return str(value)
    if kind == DECIMAL:
        return Decimal(value)
    if kind == FLOAT:
        return float(value)
    if kind == STRING:
        return str(value)
    if kind == BYTES:
        return base64.b64decode(value)
    if kind == DATE:
        return dt.date.fromisoformat(value)
    if kind == DATETIME:
        return dt.datetime.fromisoformat(value)
    raise ValueError(f"unknown key kind {kind!r}")


@total_ordering
class PadSpaceKey:
    """Weights of a string under a PAD SPACE collation; compares as if padded with spaces."""

    __slots__ = ("space", "weights")

    def __init__(self, weights: Sequence[int], space: int):
        w = list(weights)
        while w and w[-1] == space:
            w.pop()
        self.weights = tuple(w)
        self.space = space

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PadSpaceKey):
            return NotImplemented
        return self.weights == other.weights

    def __hash__(self) -> int:
        return hash(self.weights)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, PadSpaceKey):
            return NotImplemented
        a, b = self.weights, other.weights
        n = min(len(a), len(b))
        if a[:n] != b[:n]:
            return a[:n] < b[:n]
        if len(a) == len(b):
            return False
        # One is a prefix of the other: the shorter one is padded with spaces. The remainder of
        # the longer one ends with a non-space (trailing spaces were stripped).
        if len(a) < len(b):
            first = next(u for u in b[n:] if u != self.space)
            return first > self.space
        first = next(u for u in a[n:] if u != self.space)
        return first < self.space

    def __repr__(self) -> str:
        return f"PadSpaceKey({self.weights!r})"


class WeightSource(Protocol):
    """The server's ``WEIGHT_STRING`` of whole values (a port: ``mysql/collation.ServerWeights``)."""

    def weigh(self, collation: Collation, values: Sequence[str]) -> list[bytes]: ...


_weight_source: WeightSource | None = None
_SERVER_CACHE_LIMIT = 500_000  # values per collation; the cache starts afresh beyond it


def set_weight_source(source: WeightSource | None) -> None:
    """Install where ``server`` collations get their weights in this process (the source layer
    does, when it connects to the source)."""
    global _weight_source
    _weight_source = source


def weight_source() -> WeightSource | None:
    return _weight_source


@dataclass
class Collation:
    """How the server orders strings of one collation, in a form Python can apply.

    ``method`` is ``binary`` (bytes, no pad), ``codepoint`` (UTF-8 ``*_bin``), ``bytes`` (an
    8-bit charset's ``*_bin``: encoded-byte order via ``codec``), ``weights`` (per-character
    weight table from the server) or ``server`` (each value's whole weight string from the server,
    through the installed :class:`WeightSource`; compared as bytes when NO PAD, as units with
    PAD SPACE semantics when the collation pads). ``weights`` maps a BMP code point to its weight
    units; characters above U+FFFF take ``supplementary`` (the simple collations weigh them all
    alike, as MySQL's general_ci does).
    """

    name: str
    method: str
    pad_space: bool = True
    codec: str = "utf-8"
    charset: str = "utf8mb4"
    space_weight: int = 0x20
    weight_width: int = 2  # bytes per weight unit in the server's WEIGHT_STRING
    weights: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)
    supplementary: tuple[int, ...] = ()
    _cache: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    _lock: Lock = field(default_factory=Lock, repr=False, compare=False)

    def prefetch(self, values: Sequence[Any]) -> None:
        """Ask the server for the weights of the ``values`` not yet known, in one round (a batch of
        binlog rows before they are placed into chunks); nothing for the other methods."""
        if self.method != "server":
            return
        wanted = list(dict.fromkeys(v for v in map(self._text, values) if v not in self._cache))
        if wanted:
            self._remember(wanted, self._source().weigh(self, wanted))

    def server_weight(self, value: str) -> bytes:
        """The server's weight string of ``value`` (``server`` method), from the cache or asked."""
        got = self._cache.get(value)
        if got is None:
            got = self._source().weigh(self, [value])[0]
            self._remember([value], [got])
        return got

    def __getstate__(self) -> dict[str, Any]:  # the cache and its lock stay in their process
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _cache={}, _lock=Lock())

    def _source(self) -> WeightSource:
        if _weight_source is None:
            raise RuntimeError(f"collation {self.name} is ordered by the server, and this process has no connection "
                               "to the source installed (mysql.collation.use_server_weights)")  # fmt: skip
        return _weight_source

    def _remember(self, values: Sequence[str], weights: Sequence[bytes]) -> None:
        with self._lock:
            if len(self._cache) + len(values) > _SERVER_CACHE_LIMIT:
                self._cache.clear()
            self._cache.update(zip(values, weights, strict=True))

    def _text(self, value: Any) -> str:
        if isinstance(value, bytes | bytearray):
            return bytes(value).decode(self.codec, errors="replace")
        return str(value)

    def units(self, s: str) -> tuple[int, ...]:
        if self.method == "codepoint":
            return tuple(map(ord, s))
        if self.method == "bytes":
            return tuple(s.encode(self.codec, errors="replace"))
        if self.method == "server":
            raw, width = self.server_weight(s), self.weight_width
            return tuple(int.from_bytes(raw[i : i + width], "big") for i in range(0, len(raw), width))
        if self.method == "weights":
            out: list[int] = []
            table = self.weights
            for ch in s:
                cp = ord(ch)
                w = table.get(cp)
                if w is None:
                    if cp > 0xFFFF:
                        w = self.supplementary
                    else:
                        raise ValueError(
                            f"character U+{cp:04X} has no weight in collation {self.name}; "
                            "it cannot be stored in this column"
                        )
                out.extend(w)
            return tuple(out)
        raise ValueError(f"collation method {self.method!r} has no weight units")

    def sort_key(self, value: Any) -> Any:
        if self.method == "binary":
            return bytes(value) if not isinstance(value, str) else value.encode("utf-8")
        if isinstance(value, bytes | bytearray):
            value = bytes(value).decode(self.codec, errors="replace")
        if self.method == "server" and not self.pad_space:
            return self.server_weight(value)  # NO PAD: the weight strings compare as bytes
        units = self.units(value)
        if self.pad_space:
            return PadSpaceKey(units, self.space_weight)
        return units

    # ----------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "method": self.method,
            "pad_space": self.pad_space,
            "codec": self.codec,
            "charset": self.charset,
            "space_weight": self.space_weight,
            "weight_width": self.weight_width,
        }
        if self.method == "weights":
            d["weights"] = {str(cp): list(w) for cp, w in self.weights.items()}
            d["supplementary"] = list(self.supplementary)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Collation:
        return cls(
            name=d["name"],
            method=d["method"],
            pad_space=bool(d.get("pad_space", True)),
            codec=d.get("codec", "utf-8"),
            charset=d.get("charset", "utf8mb4"),
            space_weight=int(d.get("space_weight", 0x20)),
            weight_width=int(d.get("weight_width", 2)),
            weights={int(cp): tuple(w) for cp, w in d.get("weights", {}).items()},
            supplementary=tuple(d.get("supplementary", ())),
        )


BINARY = Collation(name="binary", method="binary", pad_space=False)


@dataclass(frozen=True)
class KeyColumn:
    """One chunk-key column: its name, kind and, for strings, collation name."""

    name: str
    kind: str
    collation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "collation": self.collation}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeyColumn:
        return cls(d["name"], d["kind"], d.get("collation"))


class KeyOrder:
    """Sort keys for composite chunk-key values, consistent with the database's row comparison."""

    def __init__(self, columns: Sequence[KeyColumn], collations: dict[str, Collation] | None = None):
        self.columns = tuple(columns)
        collations = collations or {}
        self._funcs = []
        self._server_columns: list[tuple[int, Collation]] = []
        for i, col in enumerate(self.columns):
            if col.kind == STRING:
                if not col.collation:
                    raise ValueError(f"string key column {col.name} needs a collation")
                coll = collations.get(col.collation)
                if coll is None:
                    raise ValueError(
                        f"no ordering known for collation {col.collation} of key column {col.name}"
                    )
                self._funcs.append(coll.sort_key)
                if coll.method == "server":
                    self._server_columns.append((i, coll))
            elif col.kind == BYTES:
                self._funcs.append(BINARY.sort_key)
            elif col.kind == DATETIME:
                self._funcs.append(_naive_utc)
            elif col.kind == TIME:
                self._funcs.append(time_micros)
            elif col.kind == BIT:
                self._funcs.append(int)
            elif col.kind in KEY_KINDS:
                self._funcs.append(_identity)
            else:
                raise ValueError(f"unsupported key kind {col.kind!r} for column {col.name}")

    @property
    def asks_server(self) -> bool:
        """Whether a column's order comes from the server (``server`` collation)."""
        return bool(self._server_columns)

    def prefetch(self, keys: Sequence[Sequence[Any]]) -> None:
        """Learn at once the server weights the sort keys of ``keys`` will need (one round per
        ``server`` collation column; nothing when no column has one)."""
        for i, coll in self._server_columns:
            coll.prefetch([k[i] for k in keys if k[i] is not None])

    def sort_key(self, values: Sequence[Any]) -> tuple[Any, ...]:
        if len(values) != len(self._funcs):
            raise ValueError(f"key has {len(values)} values, expected {len(self._funcs)}")
        return tuple(f(v) for f, v in zip(self._funcs, values, strict=True))


def _identity(v: Any) -> Any:
    return v


def time_micros(v: Any) -> int:
    """A TIME key's signed microseconds: its order. Takes the canonical text or a ``timedelta``."""
    if isinstance(v, dt.timedelta):
        return (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds
    text = str(v).strip()
    negative = text.startswith("-")
    hms, _, frac = text.lstrip("-").partition(".")
    h, m, sec = (int(p) for p in hms.split(":"))
    micros = ((h * 60 + m) * 60 + sec) * 1_000_000 + int((frac + "000000")[:6])
    return -micros if negative else micros


def time_text(v: Any) -> str:
    """A TIME key as text the server reads back as the same TIME: ``[-]HH:MM:SS.ffffff``."""
    micros = time_micros(v)
    sign = "-" if micros < 0 else ""
    secs, frac = divmod(abs(micros), 1_000_000)
    return f"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}.{frac:06d}"


def _naive_utc(v: Any) -> Any:
    """DATETIME/TIMESTAMP keys: the snapshot path reads naive UTC, the binlog path may give aware UTC."""
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC).replace(tzinfo=None)
    return v
