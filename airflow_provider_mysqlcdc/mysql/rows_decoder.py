"""Decode the rows of a binlog rows event straight into canonical values, one compiled decoder per table map.

Why: decoding is the stream's bottleneck (docs/architecture.md, "Binlog decoding").
python-mysql-replication reads every value through several Python method calls (``packet.read``,
``struct.unpack``, bit slicing), and ``core/types.py`` then converts every value once more. Here
the wire format of each column is known from the TABLE_MAP event and its meaning from the table's
schema (``mysql/column_decoders.py`` plans each column), so a decoder is *generated* per table map:
straight-line Python over one ``bytes`` object that walks the row images of an event, each column
decoded and converted in one step. Before images can skip every column but the key columns (what
the stream's sink and filter use).

The result must equal python-mysql-replication + ``binlog_row_converter`` value for value
(tests/integration/test_rows_decoder.py compares both over every type). What cannot be decoded
exactly here — another wire type than the schema expects (a column changed by an ALTER the stream
has not followed), a character set off the fast path, MySQL 8 binary JSON, old temporal formats —
raises :class:`UnsupportedRowFormat` when the decoder is built, and the reader falls back to
python-mysql-replication for that table map.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.mysql.column_decoders import UnsupportedRowFormat, column_plan


def key_image_columns(primary_key: Sequence[str], chunk_key: Sequence[str]) -> list[str]:
    """The columns a key-only before image carries: the primary key (what a sink deletes by) and
    the chunk key (what the handoff filter and the snapshot window locate a chunk by), no repeats."""
    return list(dict.fromkeys([*primary_key, *chunk_key]))


_INT_FORMATS = {(1, True): "<b", (1, False): "<B", (2, True): "<h", (2, False): "<H",
                (4, True): "<i", (4, False): "<I", (8, True): "<q", (8, False): "<Q"}  # fmt: skip


class _Source:
    """Generated code, with the names it refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.env: dict[str, Any] = {"_from": int.from_bytes, "_unpack": struct.unpack_from}

    def name(self, value: Any, prefix: str) -> str:
        n = f"{prefix}{len(self.env)}"
        self.env[n] = value
        return n


class _MissingColumn:
    """A column the row image lacks: no Arrow column accepts it (see :class:`RowsDecoder`)."""

    def __repr__(self) -> str:
        return "<a column missing from the binlog row image: the table was altered>"


MISSING = _MissingColumn()


class RowsDecoder:
    """Decodes the rows part of WRITE/UPDATE/DELETE rows events of one table map.

    ``binlog_columns`` are python-mysql-replication's ``Column`` objects of the TABLE_MAP event
    (names need ``binlog_row_metadata=FULL``); ``schema`` is the table's schema the stream runs
    with; ``added_columns`` are columns the stream added (ALTER ... ADD COLUMN) that older images
    lack: they come out as ``added_defaults`` says (the value the ADD gave existing rows), else
    None. ``key_columns``: a before image holds only these (None = all).
    ``renamed_columns`` (old -> new): an image written before a column was renamed carries the old
    name, read as the new one. A column of ``schema`` that the image lacks and that is neither added
    nor retired comes out as :data:`MISSING`, which no Arrow column accepts: the block holding it is
    'invalid', and the stream stops at the DDL that explains it (stream/schema_follow.py).
    """

    def __init__(
        self,
        table: str,
        binlog_columns: Sequence[Any],
        schema: TableSchema,
        added_columns: Iterable[str] = (),
        key_columns: Sequence[str] | None = None,
        renamed_columns: Mapping[str, str] | None = None,
        added_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.table = table
        self.defaults = dict(added_defaults or {})
        by_name = {c.name: c for c in schema.columns}
        renamed = renamed_columns or {}
        names = [renamed[c.name] if c.name not in by_name and c.name in renamed else c.name for c in binlog_columns]
        wanted = [c.name for c in schema.columns]
        self.missing = [n for n in wanted if n not in names and n not in set(added_columns)]
        plans = [column_plan(bc, by_name.get(n)) for bc, n in zip(binlog_columns, names, strict=True)]
        self.ncols = len(binlog_columns)
        self.null_bytes = (self.ncols + 7) // 8
        self._full = self._compile(names, plans, set(wanted), wanted)
        keep = set(key_columns) if key_columns is not None else set(wanted)
        self._before = self._compile(names, plans, keep & set(wanted), [n for n in wanted if n in keep])

    def _compile(self, names: list[str], plans: list[Any], emit: set[str], out_order: list[str]) -> Any:
        src = _Source()
        L = src.lines
        L.append("def image(d, p):")
        L.append(f"    nb = d[p:p + {self.null_bytes}]")
        L.append(f"    p += {self.null_bytes}")
        present = {}
        for i, (name, (layout, arg, conv)) in enumerate(zip(names, plans, strict=True)):
            var = f"v{i}"
            keep = name in emit
            if keep:
                present[name] = var
            L.append(f"    if nb[{i >> 3}] & {1 << (i & 7)}:")
            L.append(f"        {var} = None" if keep else "        pass")
            L.append("    else:")
            if layout == "int":
                size, signed = arg
                if keep:
                    fmt = _INT_FORMATS.get((size, signed))  # a struct read: no slice, no keyword call
                    if fmt is not None:
                        expr = f"{src.name(struct.Struct(fmt).unpack_from, 'u')}(d, p)[0]"
                    else:
                        expr = f"_from(d[p:p + {size}], 'little', signed={signed})"
                    if conv is not None:
                        expr = f"{src.name(conv, 'c')}({expr})"
                    L.append(f"        {var} = {expr}")
                L.append(f"        p += {size}")
            elif layout in ("float", "double"):
                if keep:
                    L.append(f"        {var} = _unpack('{'<f' if layout == 'float' else '<d'}', d, p)[0]")
                L.append(f"        p += {arg}")
            elif layout == "fixed":
                if keep:
                    L.append(f"        {var} = {src.name(conv, 'c')}(d[p:p + {arg}])")
                L.append(f"        p += {arg}")
            else:  # var: length prefix, then bytes
                if arg == 1:
                    L.append("        n = d[p]")
                elif arg == 2:
                    L.append("        n = d[p] | d[p + 1] << 8")
                else:
                    L.append(f"        n = _from(d[p:p + {arg}], 'little')")
                L.append(f"        p += {arg}")
                if keep:
                    if conv == "utf8":
                        L.append(f"        {var} = d[p:p + n].decode('utf-8')")
                    elif conv == "bytes":
                        L.append(f"        {var} = d[p:p + n]")
                    else:
                        L.append(f"        {var} = {src.name(conv, 'c')}(d[p:p + n])")
                L.append("        p += n")
        gone = src.name(MISSING, "m") if self.missing else "None"

        def absent(n: str) -> str:
            if n in self.missing:
                return gone
            return src.name(self.defaults[n], "d") if self.defaults.get(n) is not None else "None"

        items = ", ".join(f"{n!r}: {present[n] if n in present else absent(n)}" for n in out_order)
        L.append(f"    return {{{items}}}, p")
        code = "\n".join(L)
        exec(_compiled(code, f"<rows decoder {self.table}>"), src.env)
        return src.env["image"]

    def decode(self, body: bytes, kind: str) -> list[Any]:
        """Rows of a rows event body (after the column bitmaps, without the checksum).

        ``kind`` 'c' or 'd': a list of images; 'u': a list of (before, after) pairs. Before images
        (of 'd' and 'u') hold only the key columns when ``key_columns`` was given.
        """
        end = len(body)
        p = 0
        out: list[Any] = []
        append = out.append
        try:
            if kind == "u":
                before, full = self._before, self._full
                while p < end:
                    b, p = before(body, p)
                    a, p = full(body, p)
                    append((b, a))
            else:
                image = self._full if kind == "c" else self._before
                while p < end:
                    r, p = image(body, p)
                    append(r)
        except (struct.error, IndexError):  # a fixed-size read beyond the body
            p = end + 1
        if p != end:
            raise ValueError(f"rows event of {self.table}: decoded past the end of the event ({p} > {end})")
        return out


@functools.lru_cache(maxsize=4096)
def _compiled(code: str, filename: str) -> Any:
    """The decoder source compiled once per process. A stream task builds a decoder for every table
    map it meets, and a Python worker runs many tasks: over hundreds of tables, compiling the same
    source again was most of a task's time. The code object holds no per-table state (the values it
    uses come from the ``env`` it is executed in), so sharing it is safe."""
    return compile(code, filename, "exec")


__all__ = ["RowsDecoder", "UnsupportedRowFormat", "key_image_columns"]
