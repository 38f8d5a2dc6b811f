"""Learn a collation's order from the server, so Python can place string keys into chunks.

For ``*_bin`` and ``binary`` the order is known without asking. For every other collation we
ask the server for the ``WEIGHT_STRING`` of each BMP character in one query (~65k rows, well under
a second) and build a weight table; a string's sort key is the concatenation of its characters'
weights, compared with PAD SPACE semantics when the collation pads. That is exact for the simple
collations (``*_general_ci``, 8-bit ``*_ci``) and for UCA collations without contractions; to be
safe, :func:`verify_collation` re-checks Python's weights against the server for sample values
(the splitter passes every split boundary), and a collation that fails is refused with a clear
error instead of risking a misplaced row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_provider_mysqlcdc.core.keys import Collation, PadSpaceKey

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


def fetch_collation(conn: Any, collation: str) -> Collation:
    """Build a :class:`Collation` for ``collation`` by asking the server."""
    coll = _ident(collation)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME = %s", (coll,)
        )
        row = cur.fetchone()
        if row is None:
            raise UnsupportedCollationError(f"the server does not know collation {collation!r}")
        charset = _ident(str(row[0]))
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

        cur.execute(f"SELECT HEX(WEIGHT_STRING(CONVERT(' ' USING {charset}) COLLATE {coll}))")
        space_hex = cur.fetchone()[0] or ""
        width = 1 if len(space_hex) == 2 else 2
        space = _units(space_hex, width)
        if len(space) != 1:
            raise UnsupportedCollationError(
                f"collation {collation} weighs a space as {space_hex}; its PAD SPACE order cannot be "
                "reproduced. Use a *_bin or *_general_ci collation for string chunk keys, or an integer key"
            )
        cur.execute(_BMP_SQL.format(cs=charset, coll=coll))
        weights = {int(n): _units(h, width) for n, h in cur.fetchall()}

        supplementary: tuple[int, ...] = ()
        if charset.lower() == "utf8mb4":
            probes = []
            for ch in _PROBE_SUPPLEMENTARY:
                cur.execute(f"SELECT HEX(WEIGHT_STRING(CONVERT(%s USING utf8mb4) COLLATE {coll}))", (ch,))
                probes.append(_units(cur.fetchone()[0], width))
            if len(set(probes)) != 1:
                raise UnsupportedCollationError(
                    f"collation {collation} gives characters above U+FFFF distinct weights, which this "
                    "provider cannot yet reproduce: use a *_bin, *_general_ci or *_unicode_ci collation for "
                    "string chunk keys, or an integer chunk key"
                )
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


def verify_collation(conn: Any, collation: Collation, samples: Iterable[str]) -> None:
    """Check that Python orders ``samples`` exactly as the server's ``WEIGHT_STRING`` does."""
    if collation.method == "binary":
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
