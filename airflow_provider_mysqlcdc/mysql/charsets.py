"""Text in any character set, decoded from its bytes exactly as the server decodes it.

The snapshot reads text the server has converted to utf8mb4; the binlog carries a column's raw bytes
in the column's own character set, so the stream must turn them into the same characters. Python's
codec of the same name is often another definition (MySQL ``latin1`` is cp1252, ``sjis`` is not
Python's ``shift_jis``, ``big5``/``gbk``/``cp932`` differ in places, ``swe7``, ``dec8``, ``hp8``,
``keybcs2``, ``macce``, ``armscii8``, ``geostd8`` have no Python codec at all), and a wrong guess is
silent. So:

* the Unicode encodings (utf8/utf8mb3/utf8mb4, utf16, utf16le, utf32, ucs2) use Python's codec of
  the same encoding — one definition by construction (the server's utf16/utf32/ucs2 are big-endian);
* ``latin1`` uses cp1252 with the five bytes cp1252 leaves undefined as the server has them (the
  C1 controls U+0081, U+008D, U+008F, U+0090, U+009D), needing no server;
* every other set is decoded by a table the server itself gives, learned once per server and
  process (:class:`ServerCharsets`): the character ``CONVERT(... USING utf8mb4)`` makes of each
  byte, and for a multi-byte set of each two-byte sequence (three-byte for EUC-JP's 0x8F prefix).
  A value is then read as the server's own conversion reads it: a byte that starts a known
  sequence takes the sequence, any other byte stands for its single-byte character (``?`` where the
  server has none).

A set whose sequences are longer than the tables cover (MySQL's ``gb18030`` four-byte sequences)
is refused by name (:class:`UnsupportedCharset`); ``mysql/checks`` skips such a table with the
reason instead of streaming wrong text.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings

TextDecoder = Callable[[bytes], str]

#: Unicode encodings: the server's definition is the encoding itself.
UNICODE_CODECS = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "utf16": "utf-16-be",
                  "utf16le": "utf-16-le", "utf32": "utf-32-be", "ucs2": "utf-16-be"}  # fmt: skip
#: Sets whose longest sequences the tables do not cover, with why.
UNCOVERED = {"gb18030": "its four-byte sequences (1.6 million) are not learned from the server"}



def _mariadb_latin1_errors(exc: UnicodeError) -> tuple[str, int]:
    if isinstance(exc, UnicodeDecodeError):
        byte = exc.object[exc.start]
        if byte in (0x81, 0x8D, 0x8F, 0x90, 0x9D):
            return chr(byte), exc.start + 1
    raise exc


codecs.register_error("mysqlcdc_latin1", _mariadb_latin1_errors)


def _latin1(b: bytes) -> str:
    """The server's latin1 is cp1252, except that the five bytes cp1252 leaves undefined map to the C1
    controls U+0081.. (what the server itself converts them to, so what the snapshot reads)."""
    return b.decode("cp1252", "mysqlcdc_latin1")


_BYTES = "WITH RECURSIVE b(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM b WHERE n < 255) "
_AS_TEXT = "HEX(CONVERT(CONVERT({seq} USING {cs}) USING utf8mb4))"


class UnsupportedCharset(ValueError):
    """Text in this character set cannot be decoded from the binlog exactly; the message says why."""


def unsupported_reason(charset: str | None) -> str | None:
    """Why text in ``charset`` cannot be streamed exactly, or None when it can."""
    cs = (charset or "").lower()
    if cs in UNCOVERED:
        return f"character set {cs}: {UNCOVERED[cs]}, so its text cannot be decoded from the binlog exactly"
    return None


def _ident(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise UnsupportedCharset(f"suspicious character set name {name!r}")
    return name


@dataclass(frozen=True)
class CharsetTable:
    """What the server makes of each byte (``single``, 256 characters) and each multi-byte sequence
    (``multi``: the sequence's bytes -> its character) of one character set."""

    charset: str
    single: tuple[str, ...]
    multi: dict[bytes, str]

    def decoder(self) -> TextDecoder:
        """``bytes -> str`` as the server converts the set to utf8mb4."""
        single = {i: ch for i, ch in enumerate(self.single) if ch != chr(i)}
        ascii_same = all(self.single[i] == chr(i) for i in range(128))
        if not self.multi:
            return lambda b: b.decode("latin-1").translate(single)
        one = self.single
        two = {k: v for k, v in self.multi.items() if len(k) == 2}
        three = {k: v for k, v in self.multi.items() if len(k) == 3}
        leads2 = frozenset(k[0] for k in two)
        leads3 = frozenset(k[0] for k in three)

        def decode(b: bytes) -> str:
            if ascii_same and b.isascii():
                return b.decode("ascii")
            out = []
            append = out.append
            i, n = 0, len(b)
            while i < n:
                c = b[i]
                if c in leads3:
                    ch = three.get(b[i : i + 3])
                    if ch is not None:
                        append(ch)
                        i += 3
                        continue
                if c in leads2:
                    ch = two.get(b[i : i + 2])
                    if ch is not None:
                        append(ch)
                        i += 2
                        continue
                append(one[c])
                i += 1
            return "".join(out)

        return decode


def learn_charset(conn: Any, charset: str) -> CharsetTable:
    """Ask the server what each byte and multi-byte sequence of ``charset`` is (two queries at most,
    three for a set with three-byte sequences)."""
    cs = _ident(charset)
    with conn.cursor() as cur:
        cur.execute("SELECT MAXLEN FROM information_schema.CHARACTER_SETS WHERE CHARACTER_SET_NAME = %s", (cs,))
        row = cur.fetchone()
        if row is None:
            raise UnsupportedCharset(f"the server does not know character set {charset!r}")
        maxlen = int(row[0])
        one = _AS_TEXT.format(seq="CHAR(b.n USING binary)", cs=cs)
        cur.execute(f"{_BYTES}SELECT b.n, {one} FROM b ORDER BY b.n")
        hexed = [h for _, h in cur.fetchall()]
        single = tuple(_one_char(h) or "?" for h in hexed)
        multi: dict[bytes, str] = {}
        if maxlen >= 2:
            two = _AS_TEXT.format(seq="CHAR(hi.n, lo.n USING binary)", cs=cs)
            cur.execute(f"{_BYTES}SELECT hi.n, lo.n, {two} FROM b hi, b lo WHERE hi.n >= 128")
            for hi, lo, h in cur.fetchall():
                ch = _one_char(h)
                if ch is not None:
                    multi[bytes((hi, lo))] = ch
        if maxlen >= 3:
            # Three-byte sequences start with a byte that is neither a character nor the start of a
            # two-byte sequence (EUC-JP's 0x8F), then two bytes of the upper half, as EUC has them.
            starts = {k[0] for k in multi}
            leads = [n for n in range(0x80, 0x100) if single[n] == "?" and n not in starts]
            seq = "CHAR(l.n, hi.n, lo.n USING binary)"
            conv = f"CONVERT(CONVERT({seq} USING {cs}) USING utf8mb4)"
            cur.execute(f"{_BYTES}SELECT l.n, hi.n, lo.n, HEX({conv}) FROM b l, b hi, b lo WHERE l.n IN "
                        f"({', '.join(map(str, leads)) or 'NULL'}) AND hi.n >= 128 AND lo.n >= 128 "
                        f"AND CHAR_LENGTH({conv}) = 1")  # fmt: skip
            for lead, hi, lo, h in cur.fetchall():
                ch = _one_char(h)
                if ch is not None:
                    multi[bytes((lead, hi, lo))] = ch
            if not any(len(k) == 3 for k in multi):
                raise UnsupportedCharset(
                    f"character set {cs} has sequences of up to {maxlen} bytes, and no three-byte one was "
                    "found: its text cannot be decoded from the binlog exactly"
                )
    return CharsetTable(charset=cs, single=single, multi=multi)


def _one_char(hexed: str | None) -> str | None:
    """The single character the server made of a sequence, or None (it made several, or none)."""
    if not hexed:
        return None
    text = bytes.fromhex(hexed).decode("utf-8")
    return text if len(text) == 1 else None


class ServerCharsets:
    """Decoders of the source's character sets, each learned once (one connection, then closed)."""

    def __init__(self, settings: ConnectionSettings):
        self.settings = settings
        self._decoders: dict[str, TextDecoder] = {}
        self._lock = threading.Lock()

    def decoder(self, charset: str) -> TextDecoder:
        cs = charset.lower()
        with self._lock:
            dec = self._decoders.get(cs)
            if dec is None:
                with self.settings.connect() as conn:
                    dec = self._decoders[cs] = learn_charset(conn, cs).decoder()
            return dec


_source: ServerCharsets | None = None
_by_server: dict[tuple[str, int], ServerCharsets] = {}


def use_server_charsets(settings: ConnectionSettings) -> None:
    """Decode this process's text in sets Python cannot decode exactly by the source at ``settings``
    (``ConnectionSettings.connect`` calls this, like ``collation.use_server_weights``)."""
    global _source
    key = (settings.host, int(settings.port))
    current = _by_server.get(key)
    if current is None:
        current = _by_server[key] = ServerCharsets(settings)
    current.settings = settings  # the latest login: an earlier one may be gone (the tables learned stay)
    _source = current


def text_decoder(charset: str | None) -> TextDecoder:
    """``bytes -> str`` for text in ``charset``, exactly as the server converts it to utf8mb4."""
    cs = (charset or "utf8mb4").lower()
    codec = UNICODE_CODECS.get(cs)
    if codec is not None:
        return lambda b: b.decode(codec)
    if cs == "latin1":
        return _latin1
    reason = unsupported_reason(cs)
    if reason is not None:
        raise UnsupportedCharset(reason)
    if _source is None:
        raise UnsupportedCharset(
            f"text in character set {cs} is decoded by the source's own table, and this process has no "
            "connection settings to learn it from: connect to the source once first "
            "(ConnectionSettings.connect, or mysql.charsets.use_server_charsets)"
        )
    return _source.decoder(cs)


__all__ = ["CharsetTable", "ServerCharsets", "TextDecoder", "UnsupportedCharset", "learn_charset", "text_decoder",
           "unsupported_reason", "use_server_charsets"]  # fmt: skip
