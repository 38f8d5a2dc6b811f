"""Every character set the server offers, and every kind of chunk key, snapshotted and streamed exactly.

The snapshot reads text converted by the server; the stream decodes the binlog's raw bytes itself.
Python's codec of a charset's name often differs from the server's definition (MySQL ``latin1`` is
cp1252, ``swe7``/``dec8``/``hp8``/``keybcs2``/``macce``/``armscii8``/``geostd8`` have no Python
codec, ``sjis`` is not Python's ``shift_jis``), so each table here holds **every character** its
charset encodes — every byte 0x80..0xFF of a single-byte set, every valid two-byte (and EUC three-byte)
sequence of a multi-byte one, as the server itself lists them — first in the snapshot, then in rows
the stream carries (inserts, updates of every row, deletes). A second set of tables is keyed by
TIME (negative and fractional, as ``chunk_key_columns`` of a table without a primary key), YEAR,
BIT, BINARY, VARBINARY, DECIMAL, DATE, DATETIME(6), TIMESTAMP(6) and VARCHARs in macce, big5, sjis,
latin1 (``latin1_bin``) and utf16. One snapshot and one stream
catch-up carry them all; every Delta table must then equal its source as the server reads it
(``verify.compare``: the server's own conversion to utf8mb4), not a Python-side expectation. The
snapshot reads through JDBC, so the group itself replays the writes made inside its window; the
native reader (connectorx) is then checked to read every charset table as the server does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from airflow_provider_mysqlcdc.core.manifest_build import build_manifest
from airflow_provider_mysqlcdc.core.predicate import sql_literal
from airflow_provider_mysqlcdc.mysql.checks import check_source
from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.snapshot.group import SnapshotOptions, run_snapshot_group
from airflow_provider_mysqlcdc.snapshot.native_reader import chunk_query, connection_uri, native_reader_unavailable
from airflow_provider_mysqlcdc.snapshot.staging import SnapshotTestHooks
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.job import StreamOptions, start_stream, stop_gracefully, wait_until_caught_up
from tests.integration.test_stream_e2e import assert_sink_equals_source
from tests.support.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CHARS_PER_ROW = 64
#: Unicode sets, filled from Python text (every character of them is valid in them by definition).
UNICODE_TEXT = "aé€ж中あ한\u0081\u00a0\ufffd\U0001f600\U00020000"
#: The sets that hold only the BMP.
BMP_ONLY = {"ucs2", "utf8mb3", "utf8"}
#: Lead bytes of the EUC three-byte sequences (JIS X 0212 in ujis/eucjpms).
THREE_BYTE_PREFIX = {"ujis": 0x8F, "eucjpms": 0x8F}

_BYTE = "WITH RECURSIVE b(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM b WHERE n < 255) "


def _characters(server: MariaDBServer, charset: str, maxlen: int) -> list[bytes]:
    """Every character ``charset`` encodes, as the server lists it: each byte from 0x21 and each
    sequence of two bytes (three after EUC's 0x8F) from 0x80 that the server converts to exactly one
    character other than '?'."""
    conv = f"CONVERT(CONVERT(UNHEX(h) USING {charset}) USING utf8mb4)"
    shapes = [("LPAD(HEX(lo.n), 2, '0')", "b lo", "lo.n >= 33")]
    if maxlen > 1:
        shapes.append(("LPAD(HEX(hi.n * 256 + lo.n), 4, '0')", "b hi, b lo", "hi.n >= 128"))
    prefix = THREE_BYTE_PREFIX.get(charset)
    if prefix is not None:
        shapes.append((f"CONCAT('{prefix:02X}', LPAD(HEX(hi.n * 256 + lo.n), 4, '0'))", "b hi, b lo",
                       "hi.n >= 128 AND lo.n >= 128"))  # fmt: skip
    out: list[bytes] = []
    for shape, froms, where in shapes:
        sql = (f"{_BYTE}SELECT h FROM (SELECT {shape} AS h FROM {froms} WHERE {where}) s "
               f"WHERE CHAR_LENGTH({conv}) = 1 AND HEX({conv}) <> '3F' ORDER BY h")  # fmt: skip
        out += [bytes.fromhex(r[0]) for r in server.query(sql)]
    return out


def _rows(chars: list[bytes], shift: int) -> list[list[bytes]]:
    """The characters in rows of CHARS_PER_ROW, rotated by ``shift`` (an update writes other text)."""
    if shift:
        chars = chars[shift % len(chars) :] + chars[: shift % len(chars)]
    return [chars[i : i + CHARS_PER_ROW] for i in range(0, len(chars), CHARS_PER_ROW)] or [[]]


def _charset_tables(server: MariaDBServer, db: str) -> dict[str, tuple[str, list[bytes]]]:
    """One table per character set: ``{table: (charset, characters)}`` (binary: VARBINARY)."""
    tables: dict[str, tuple[str, list[bytes]]] = {}
    for charset, maxlen in server.query("SELECT CHARACTER_SET_NAME, MAXLEN FROM information_schema.CHARACTER_SETS"):
        cs = str(charset)
        t = f"cs_{cs}"
        server.execute(f"CREATE TABLE `{db}`.{t} (id INT NOT NULL PRIMARY KEY, s VARCHAR(300) CHARACTER SET {cs}, "
                       f"c CHAR(8) CHARACTER SET {cs}, x MEDIUMTEXT CHARACTER SET {cs})")  # fmt: skip
        if cs == "binary":
            chars = [bytes([i]) for i in range(256)]
        elif cs.startswith(("utf", "ucs")):
            text = UNICODE_TEXT if cs not in BMP_ONLY else "".join(ch for ch in UNICODE_TEXT if ord(ch) <= 0xFFFF)
            chars = [ch.encode("utf-8") for ch in text]
        else:
            chars = _characters(server, cs, int(maxlen))
            assert len(chars) >= 90, (cs, len(chars))
        tables[t] = (cs, chars)
    return tables


def _write(server: MariaDBServer, db: str, tables: dict[str, tuple[str, list[bytes]]], shift: int,
           first_id: int, count: int | None = None) -> None:  # fmt: skip
    """Rows from ``first_id`` on (``count`` of them, else one per CHARS_PER_ROW characters) of every
    table, replacing what is there, from the characters rotated by ``shift``."""
    with server.root_connection(db) as conn, conn.cursor() as cur:
        for t, (cs, chars) in tables.items():
            rows = _rows(chars, shift)[:count]
            if cs == "binary":
                value = "%s"
            else:  # Unicode sets get their text through the connection (utf8mb4), the others their own bytes
                value = f"CONVERT(%s USING {'utf8mb4' if cs.startswith(('utf', 'ucs')) else cs})"
            args = [(first_id + i, b"".join(r), b"".join(r[:3]), b"".join(r) * 3)
                    for i, r in enumerate(rows)]  # fmt: skip
            cur.executemany(f"REPLACE INTO {t} VALUES (%s, {value}, {value}, {value})", args)
        conn.commit()


KEY_ROWS = 450  # with CHUNK rows a chunk, every key table has boundaries inside it
CHUNK = 200


def _time(seconds: float, fsp: int) -> str:
    sign = "-" if seconds < 0 else ""
    micros = round(abs(seconds) * 1_000_000)
    secs, frac = divmod(micros, 1_000_000)
    text = f"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return f"'{text}.{frac:06d}'" if fsp else f"'{text}'"


def _letters(alphabet: str, i: int) -> str:
    """Two letters, then a number: unique even where the collation folds accents and case."""
    return "'" + alphabet[i % len(alphabet)] + alphabet[i // len(alphabet) % len(alphabet)] + f"{i % 7}{i}'"


#: Key tables: the key column's type, its i-th value as SQL, and whether the key is only UNIQUE (a
#: table without a primary key, chunked by ``chunk_key_columns``). Values span negative and
#: fractional TIMEs, every YEAR, BIT, padded BINARY, prefixes among VARBINARY, DECIMAL signs, dates
#: across 1582, fractional DATETIME/TIMESTAMP, and letters that Python's codecs do not have or order.
KEYS: dict[str, tuple[str, Callable[[int], str], bool]] = {
    "k_time": ("TIME(3)", lambda i: _time((i - KEY_ROWS // 2) * 3723.457, 3), True),
    "k_time_pk": ("TIME(6)", lambda i: _time((KEY_ROWS // 2 - i) * 1.000001 - 0.5, 6), False),
    "k_time0": ("TIME", lambda i: _time((i - KEY_ROWS // 2) * 6700, 0), False),
    "k_year": ("YEAR", lambda i: str(0 if i % 256 == 0 else 1900 + i % 256), False),
    "k_bit": ("BIT(12)", lambda i: f"b'{i * 9:b}'", False),
    "k_bit1": ("BIT(1)", lambda i: f"b'{i % 2}'", True),
    "k_binary": ("BINARY(4)", lambda i: f"x'{(i * 37) % 65536:04x}{'' if i % 3 else '00'}'", False),
    "k_varbinary": ("VARBINARY(8)", lambda i: f"x'{'00' * (i % 3)}{(i * 101) % 65536:04x}'", True),
    "k_decimal": ("DECIMAL(20,6)", lambda i: f"{(i - KEY_ROWS // 2) * 1234567.000123:.6f}", False),
    "k_date": ("DATE", lambda i: f"DATE'1000-01-01' + INTERVAL {i * 7000} DAY", False),
    "k_datetime": ("DATETIME(6)", lambda i: f"TIMESTAMP'1582-10-01 00:00:00' + INTERVAL {i * 777777777} MICROSECOND"
                                            f" + INTERVAL {i} DAY", False),
    "k_timestamp": ("TIMESTAMP(6)", lambda i: f"FROM_UNIXTIME(1 + {i} * 4700000.000001)", False),
    # string keys in sets without an equal Python codec: chunk predicates convert on the server
    "k_macce": ("VARCHAR(20) CHARACTER SET macce", lambda i: _letters("AĄČĎĘŁŃŇŘŠŤŽąčďęłńňřšťžz", i), False),
    "k_big5": ("VARCHAR(20) CHARACTER SET big5", lambda i: _letters("a中文字體碁一二三四五六七八九十", i), True),
    "k_sjis": ("VARCHAR(20) CHARACTER SET sjis", lambda i: _letters("aｶ日本語カナあいうえお―", i), False),
    # and in sets with one: an 8-bit *_bin (ordered by encoded bytes) and UTF-16
    "k_latin1": ("VARCHAR(20) CHARACTER SET latin1 COLLATE latin1_bin", lambda i: _letters("aAéÉß€Ÿz", i), False),
    "k_utf16": ("VARCHAR(20) CHARACTER SET utf16", lambda i: _letters("aé中😀ж", i), True),
}  # fmt: skip


def _key_tables(server: MariaDBServer, db: str) -> dict[str, list[str]]:
    """The key tables, filled; returns ``chunk_key_columns`` for those without a primary key."""
    chunk_keys: dict[str, list[str]] = {}
    for t, (ddl, value, unique_only) in KEYS.items():
        key = "UNIQUE KEY" if unique_only else "PRIMARY KEY"
        server.execute(f"CREATE TABLE `{db}`.{t} (k {ddl} NOT NULL, v INT NOT NULL, {key} (k))")
        rows = ", ".join(f"({value(i)}, {i})" for i in range(KEY_ROWS))
        server.execute(f"INSERT IGNORE INTO `{db}`.{t} VALUES {rows}")  # IGNORE: keys equal in the collation
        if unique_only:
            chunk_keys[f"{db}.{t}"] = ["k"]
    return chunk_keys


def _key_writes(server: MariaDBServer, db: str, step: int) -> None:
    """Updates of every row, deletes and re-inserts spread over the key range (so over the chunks)."""
    for t, (_, value, _) in KEYS.items():
        moved = [value(i) for i in range(step, KEY_ROWS, 37)]
        server.execute(f"UPDATE `{db}`.{t} SET v = v + {step}",
                       *(f"DELETE FROM `{db}`.{t} WHERE k = {v}" for v in moved[::2]),
                       *(f"INSERT IGNORE INTO `{db}`.{t} VALUES ({v}, -{step})" for v in moved[::4]))  # fmt: skip


@pytest.mark.parametrize("server", ["mariadb1011", "mysql97"], indirect=True)
def test_every_charset_and_key_kind_snapshot_and_stream_exactly(server, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On MariaDB 10.11 and MySQL 9.7, whose sets differ (MySQL adds gb18030, whose text is skipped)."""
    db = "cs_" + uuid.uuid4().hex[:8]
    server.execute(f"CREATE DATABASE {db}")
    cdc_settings = server.cdc_settings()
    try:
        charsets = _charset_tables(server, db)
        _write(server, db, charsets, 0, 0)
        chunk_keys = _key_tables(server, db)
        # A type with no canonical value (MariaDB's INET6, MySQL's VECTOR) and a set whose text cannot
        # be decoded exactly (MySQL's gb18030) are skipped with their reasons; the rest goes on.
        mariadb = "MariaDB" in str(server.query("SELECT VERSION()")[0][0])
        server.execute(f"CREATE TABLE `{db}`.t_odd (id INT PRIMARY KEY, a {'INET6' if mariadb else 'VECTOR(3)'})")
        tables = [f"{db}.{t}" for t in [*charsets, *KEYS, "t_odd"]]
        with cdc_settings.connect() as conn:
            report = check_source(conn, tables, chunk_keys)
        skipped = {str(p.table): p.code for p in report.problems if p.table}
        want = {f"{db}.t_odd": "column_type"} | ({} if mariadb else {f"{db}.cs_gb18030": "character_set"})
        assert skipped == want, report.problems
        tables = [t for t in tables if t not in skipped]
        store = StateStore(str(tmp_path / "state"), "cs")
        sink = DeltaSink(str(tmp_path / "lake"))
        with cdc_settings.connect() as conn:
            plan = plan_snapshot(conn, tables, CHUNK, 10_000, chunk_key_columns=chunk_keys)
        assert len(plan.groups) == 1, len(plan.groups)  # one window: every table's replay decodes the binlog
        for t in KEYS:  # boundaries inside every key table but BIT(1)'s two rows
            assert t == "k_bit1" or sum(1 for c in plan.splits if c.table == f"{db}.{t}") >= 2, t
        for t, text in (("k_big5", "中文"), ("k_sjis", "ｶ日"), ("k_macce", "Ąž")):  # the splitter's equality test
            key = plan.tables[f"{db}.{t}"].chunk_key(chunk_keys.get(f"{db}.{t}"))[0]
            lit = sql_literal(key, text, plan.collations)
            assert "CONVERT" in lit and server.query(f"SELECT {lit} COLLATE {key.collation} = {lit}")[0][0] == 1
        store.write_plan("p1", plan.to_dict())

        def in_window() -> None:  # every text row rewritten, keys moved across chunks: the replay decodes them
            _write(server, db, charsets, 11, 0)
            _key_writes(server, db, 1)

        # JDBC: every chunk shares the group's HW, so the group's own replay decodes the window (the
        # native reader's chunks each end at their own HW and leave those writes to the stream).
        hooks = SnapshotTestHooks(before_high_watermark=in_window)
        run_snapshot_group(spark, cdc_settings, store, "p1", plan.groups[0].group_id, sink,
                           SnapshotOptions(reader="jdbc"), test_hooks=hooks)  # fmt: skip
        store.write_manifest(build_manifest(plan, store.read_all_results("p1")))
        assert_sink_equals_source(cdc_settings, plan, sink, tables)

        # The stream: every row rewritten with other text, new rows, deletes.
        _write(server, db, charsets, 17, 0)
        _write(server, db, charsets, 5, 100_000, 3)
        for t in charsets:
            server.execute(f"DELETE FROM `{db}`.{t} WHERE id IN (1, 100001)")
        _key_writes(server, db, 2)
        query = start_stream(spark, cdc_settings, store, sink, StreamOptions(trigger_seconds=0.5))
        try:
            with cdc_settings.connect() as conn:
                target = current_offset(conn)
            wait_until_caught_up(query, target)
        finally:
            stop_gracefully(query)
        assert_sink_equals_source(cdc_settings, plan, sink, tables)
        _assert_native_reader_reads_what_the_server_does(cdc_settings, plan, [f"{db}.{t}" for t in charsets])
    finally:
        server.execute(f"DROP DATABASE IF EXISTS {db}")


def _assert_native_reader_reads_what_the_server_does(cdc_settings, plan, tables) -> None:  # type: ignore[no-untyped-def]
    """The snapshot above read through JDBC (its window replayed by the group); the native reader,
    the default where it can read a table, must get every character as the server converts it too."""
    import connectorx as cx

    for t in tables:
        schema = plan.tables.get(t)
        if schema is None or native_reader_unavailable(cdc_settings, schema) is not None:
            continue
        sql = chunk_query(schema, "1 = 1")
        got = cx.read_sql(connection_uri(cdc_settings), sql, return_type="arrow")
        with cdc_settings.connect() as conn, conn.cursor() as cur:
            cur.execute(sql)
            want = sorted(cur.fetchall())
        assert sorted(zip(*(col.to_pylist() for col in got.columns), strict=True)) == want, t
