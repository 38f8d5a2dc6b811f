"""Learn a collation's order from the server, so Python can place string keys into chunks.

For ``*_bin`` and ``binary`` the order is known without asking. A *simple* collation — one weight
per character, no contractions, which the server declares with ``SORTLEN`` 1 (``*_general_ci``,
the 8-bit ``*_ci``) — is learned as a table: the ``WEIGHT_STRING`` of each BMP character in one
query (~65k rows, well under a second); a string's sort key is the concatenation of its
characters' weights. Every other collation (the UCA ones: MySQL's ``utf8mb4_0900_*``, MariaDB's
``uca1400`` family, ``*_unicode_ci``, language tailorings with contractions, distinct weights above
U+FFFF) is ordered by the server itself: :class:`ServerWeights` asks ``WEIGHT_STRING`` of whole
values, in batches, and the core caches them (``core/keys.Collation``, method ``server``). Python
never re-implements an order it cannot prove equal to the server's (docs/architecture.md,
"Servers and versions": *Collations*).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pymysql

from airflow_provider_mysqlcdc.core.keys import Collation, PadSpaceKey, set_weight_source, weight_source

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings

_UTF8 = {"utf8mb4", "utf8mb3", "utf8"}
_CODECS = {
    "utf8mb4": "utf-8",
    "utf8mb3": "utf-8",
    "utf8": "utf-8",
    "latin1": "cp1252",
    "ascii": "ascii",
    "latin2": "iso8859-2",
    "cp1250": "cp1250",
    "cp1251": "cp1251",
    "cp1256": "cp1256",
    "cp1257": "cp1257",
    "greek": "iso8859-7",
    "hebrew": "iso8859-8",
    "latin5": "iso8859-9",
    "latin7": "iso8859-13",
}

_DIGITS = " UNION ALL ".join(f"SELECT {i} AS d" for i in range(16))
_BMP_SQL = f"""
SELECT n, HEX(WEIGHT_STRING(CONVERT(CHAR(n USING ucs2) USING {{cs}}) COLLATE {{coll}}))
FROM (SELECT a.d * 4096 + b.d * 256 + c.d * 16 + e.d AS n
      FROM ({_DIGITS}) a, ({_DIGITS}) b, ({_DIGITS}) c, ({_DIGITS}) e) nums
WHERE n NOT BETWEEN 55296 AND 57343
  AND HEX(CONVERT(CONVERT(CHAR(n USING ucs2) USING {{cs}}) USING ucs2)) = HEX(CHAR(n USING ucs2))
"""

#: The sets that hold characters above U+FFFF (their weights are probed, not taken from the BMP table).
_SUPPLEMENTARY_SETS = {"utf8mb4", "utf16", "utf16le", "utf32"}
_PROBE_SUPPLEMENTARY = ["\U00010000", "\U0001f600", "\U0002a6d6", "\U0010fffd"]


class UnsupportedCollationError(ValueError):
    """The collation's order cannot be reproduced in Python; the message names the way out."""


def _ident(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise UnsupportedCollationError(f"suspicious collation/charset name {name!r}")
    return name


def _units(hexstr: str | None, width: int) -> tuple[int, ...]:
    if not hexstr:
        return ()
    raw = bytes.fromhex(hexstr)
    return tuple(int.from_bytes(raw[i : i + width], "big") for i in range(0, len(raw), width))


def _resolve(cur: Any, collation: str) -> tuple[str, int | None]:
    """The character set of ``collation`` and its ``SORTLEN``. MariaDB 10.10+ lists its UCA 14
    collations under a name without the character set (``uca1400_ai_ci``) and the full name
    (``utf8mb4_uca1400_ai_ci``, what a column reports) only in ``COLLATION_CHARACTER_SET_APPLICABILITY``."""
    cur.execute("SELECT CHARACTER_SET_NAME, SORTLEN FROM information_schema.COLLATIONS WHERE COLLATION_NAME = %s",
                (collation,))  # fmt: skip
    row = cur.fetchone()
    if row is not None and row[0]:
        return str(row[0]), None if row[1] is None else int(row[1])
    try:
        cur.execute(
            "SELECT a.CHARACTER_SET_NAME, c.SORTLEN FROM information_schema.COLLATION_CHARACTER_SET_APPLICABILITY a "
            "LEFT JOIN information_schema.COLLATIONS c ON c.COLLATION_NAME = a.COLLATION_NAME "
            "WHERE a.FULL_COLLATION_NAME = %s", (collation,))  # fmt: skip
        row = cur.fetchone()
    except pymysql.err.OperationalError:  # MySQL: no FULL_COLLATION_NAME column
        row = None
    if row is None:
        raise UnsupportedCollationError(f"the server does not know collation {collation!r}")
    return str(row[0]), None if row[1] is None else int(row[1])


def fetch_collation(conn: Any, collation: str) -> Collation:
    """Build a :class:`Collation` for ``collation`` by asking the server."""
    coll = _ident(collation)
    with conn.cursor() as cur:
        charset, sortlen = _resolve(cur, coll)
        charset = _ident(charset)
        # PAD SPACE or NO PAD, measured rather than guessed from the name.
        cur.execute(f"SELECT CONVERT('a' USING {charset}) COLLATE {coll} = CONVERT('a ' USING {charset})")
        pad_space = bool(cur.fetchone()[0])

        codec = _CODECS.get(charset.lower())
        if charset.lower() == "binary":
            return Collation(name=coll, method="binary", pad_space=False, charset=charset)
        if coll.lower().endswith("_bin"):
            if charset.lower() in _UTF8:
                return Collation(name=coll, method="codepoint", pad_space=pad_space, charset=charset)
            if codec is None:
                raise UnsupportedCollationError(
                    f"string keys in charset {charset} are not supported for chunking; use an integer chunk "
                    "key column or a utf8mb4 column"
                )
            return Collation(
                name=coll, method="bytes", pad_space=pad_space, codec=codec, charset=charset, space_weight=0x20
            )

        cur.execute(f"SELECT HEX(WEIGHT_STRING(CONVERT(' ' USING {charset}) COLLATE {coll})), "
                    f"HEX(WEIGHT_STRING(CONVERT('a' USING {charset}) COLLATE {coll}))")  # fmt: skip
        space_hex, a_hex = (h or "" for h in cur.fetchone())
        width = 1 if len(space_hex) == 2 else 2
        space = _units(space_hex, width)
        if sortlen != 1:
            return _server_ordered(coll, charset, codec, pad_space, space, _units(a_hex, width), width)
        if len(space) != 1:
            raise UnsupportedCollationError(
                f"collation {collation} weighs a space as {space_hex}; its PAD SPACE order cannot be "
                "reproduced. Use a *_bin or *_general_ci collation for string chunk keys, or an integer key"
            )
        cur.execute(_BMP_SQL.format(cs=charset, coll=coll))
        weights = {int(n): _units(h, width) for n, h in cur.fetchall()}

        supplementary: tuple[int, ...] = ()
        if charset.lower() in _SUPPLEMENTARY_SETS:
            probes = []
            for ch in _PROBE_SUPPLEMENTARY:
                cur.execute(f"SELECT HEX(WEIGHT_STRING(CONVERT(%s USING {charset}) COLLATE {coll}))", (ch,))
                probes.append(_units(cur.fetchone()[0], width))
            if len(set(probes)) != 1:  # they weigh apart: the server orders every value
                return _server_ordered(coll, charset, codec, pad_space, space, _units(a_hex, width), width)
            supplementary = probes[0]
    return Collation(
        name=coll,
        method="weights",
        pad_space=pad_space,
        codec=codec or "utf-8",
        charset=charset,
        space_weight=space[0],
        weight_width=width,
        weights=weights,
        supplementary=supplementary,
    )


def _server_ordered(coll: str, charset: str, codec: str | None, pad_space: bool, space: tuple[int, ...],
                    a_units: tuple[int, ...], width: int) -> Collation:  # fmt: skip
    """A collation ordered by the server's weight strings of whole values. NO PAD: the weight strings
    compare as bytes, whatever their levels. PAD SPACE: as units padded with the space's weight,
    which is the server's comparison only when the weight string has one level (one unit for 'a')."""
    if pad_space and (len(space) != 1 or len(a_units) != 1):
        raise UnsupportedCollationError(
            f"collation {coll} pads with spaces and weighs on several levels (accents or case apart), so its "
            "order cannot be placed exactly from weight strings yet. Use its NO PAD variant (*_nopad_*), an "
            "accent- and case-insensitive (*_ai_ci) or *_bin collation for the chunk key, or another chunk key "
            "(chunk_key_columns)"
        )
    return Collation(name=coll, method="server", pad_space=pad_space, codec=codec or "utf-8", charset=charset,
                     space_weight=space[0] if space else 0x20, weight_width=width)  # fmt: skip


class ServerWeights:
    """The source's ``WEIGHT_STRING`` of whole values (``core/keys.WeightSource``): one connection of
    its own, one query per 500 values; thread-safe (a stream's readers place keys concurrently)."""

    BATCH = 500

    def __init__(self, settings: ConnectionSettings):
        self.settings = settings
        self._conn: Any = None
        self._lock = threading.Lock()

    def weigh(self, collation: Collation, values: Sequence[str]) -> list[bytes]:
        cs, coll = _ident(collation.charset), _ident(collation.name)
        out: list[bytes] = []
        with self._lock:
            for i in range(0, len(values), self.BATCH):
                batch = list(values[i : i + self.BATCH])
                one = f"WEIGHT_STRING(CONVERT(%s USING {cs}) COLLATE {coll})"
                sql = " UNION ALL ".join(f"SELECT {j} AS i, {one} AS w" for j in range(len(batch)))
                rows = dict(self._query(sql, batch))
                out += [bytes(rows[j] or b"") for j in range(len(batch))]
        return out

    def _query(self, sql: str, args: list[str]) -> list[tuple[Any, ...]]:
        for attempt in (1, 2):  # a connection the server closed (wait_timeout) is opened again once
            try:
                if self._conn is None:
                    self._conn = self.settings.connect()
                with self._conn.cursor() as cur:
                    cur.execute(sql, args)
                    return list(cur.fetchall())
            except pymysql.err.OperationalError:
                self._conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def use_server_weights(settings: ConnectionSettings) -> None:
    """Order this process's ``server`` collations by the source at ``settings`` (kept when it
    already is; ``ConnectionSettings.connect`` calls this, so a process that reads the source
    places its keys by it)."""
    current = weight_source()
    if isinstance(current, ServerWeights) and current.settings == settings:
        return
    set_weight_source(ServerWeights(settings))


def verify_collation(conn: Any, collation: Collation, samples: Iterable[str]) -> None:
    """Check that Python orders ``samples`` exactly as the server's ``WEIGHT_STRING`` does."""
    if collation.method in ("binary", "server"):  # the server's own order
        return
    values = [s for s in samples if isinstance(s, str)]
    if not values:
        return
    probe = Collation(**{**collation.__dict__, "pad_space": False})
    cs, coll = _ident(collation.charset), _ident(collation.name)
    with conn.cursor() as cur:
        for i in range(0, len(values), 500):
            batch = values[i : i + 500]
            sql = " UNION ALL ".join(
                f"SELECT {j} AS i, HEX(WEIGHT_STRING(CONVERT(%s USING {cs}) COLLATE {coll})) AS w"
                for j in range(len(batch))
            )
            cur.execute(sql, batch)
            server = dict(cur.fetchall())
            for j, s in enumerate(batch):
                if collation.method != "weights":
                    continue  # *_bin: code point / byte order is exact by construction
                theirs = PadSpaceKey(_units(server[j], collation.weight_width), collation.space_weight)
                ours = PadSpaceKey(probe.units(s), collation.space_weight)
                if theirs != ours:
                    raise UnsupportedCollationError(
                        f"collation {collation.name}: Python's order of {s!r} differs from the server's "
                        "(contractions?). Use a *_bin or *_general_ci collation for string chunk keys, or an "
                        "integer chunk key"
                    )
