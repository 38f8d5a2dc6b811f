"""From a rows event to its row images: the table it belongs to and the decoder of its rows.

A rows event names its table only by the id of the TABLE_MAP event before it. Table ids map to one
table definition for a server's lifetime (a new definition gets a new id), so a table map is looked
at once per binlog file; a restart, which always starts a new file, reuses ids, so the binlog event
state machine (``mysql/binlog_events.py``) clears the maps at every rotation. A table with a schema
is decoded by the generated decoder (``mysql/rows_decoder.py``); a table map it cannot decode
exactly falls back to python-mysql-replication's own decoding (docs/architecture.md, "Binlog
decoding").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE

from airflow_provider_mysqlcdc.core.table import TableId, TableSchema
from airflow_provider_mysqlcdc.mysql.rows_decoder import RowsDecoder, UnsupportedRowFormat
from airflow_provider_mysqlcdc.mysql.server import BinlogReadError

log = logging.getLogger(__name__)

RowConverter = Callable[[str, dict[str, Any], Any], dict[str, Any]]


class TableMaps:
    """Per table id: the wanted table's ``'db.table'`` name (None for an unwanted one) and its decoder.

    ``tables`` are ``(db, table)`` pairs (None = every table). ``schemas``, ``added_columns`` and
    ``key_columns`` configure the fast decoder per table; ``convert`` converts the library's values
    for tables without one (see :class:`~.binlog_reader.BinlogRangeReader`).
    """

    def __init__(
        self,
        tables: frozenset[tuple[str, str]] | None,
        schemas: Mapping[str, TableSchema],
        added_columns: Mapping[str, Iterable[str]],
        key_columns: Mapping[str, Sequence[str]],
        convert: RowConverter | None,
        renamed_columns: Mapping[str, Mapping[str, str]] | None = None,
        added_defaults: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.tables = tables
        self.added_defaults = added_defaults or {}
        self.schemas = schemas
        self.added_columns = added_columns
        self.key_columns = key_columns
        self.convert = convert
        self.renamed_columns = renamed_columns or {}
        self._names: dict[int, str | None] = {}
        self._decoders: dict[int, RowsDecoder | None] = {}
        self._full_bitmaps: dict[int, bytes] = {}

    def clear(self) -> None:
        """Forget every table id (at a rotation: the ids of the next file may mean other tables)."""
        self._names.clear()
        self._decoders.clear()

    def table(self, ev: Any) -> str | None:
        """``'db.table'`` of a rows event's table if it is wanted, else None."""
        try:
            return self._names[ev.table_id]
        except KeyError:
            name = self._names[ev.table_id] = self._table_name(ev)
            return name

    def images(self, ev: Any, name: str, op: str, file: str, start: int) -> list[Any]:
        """The row images of a rows event of ``name`` (at ``file:start``): (before, after) pairs for
        ``op`` 'u', one image per row for 'c' and 'd'.

        Only full row images can be applied: an event missing a column would overwrite it with
        nothing, so it stops the read with the setting to fix."""
        ncols = ev.number_of_columns
        full = self._full_bitmaps.get(ncols)
        if full is None:
            full = self._full_bitmaps[ncols] = ((1 << ncols) - 1).to_bytes((ncols + 7) // 8, "little")
        partial = not _has_all(ev.columns_present_bitmap, full)
        if partial or (op == "u" and not _has_all(ev.columns_present_bitmap2, full)):
            raise BinlogReadError(
                f"a rows event of {name} at {file}:{start} does not carry every column: the source "
                "logs partial row images. Set binlog_row_image=FULL (SET GLOBAL binlog_row_image='FULL' "
                "and in the server config), then re-snapshot the tables changed since"
            )
        tid = ev.table_id
        try:
            dec = self._decoders[tid]
        except KeyError:
            dec = self._decoders[tid] = self._decoder(ev, name)
        if dec is not None:
            pkt = ev.packet
            return dec.decode(pkt.read(ev.event_size - pkt.read_bytes), op)
        if self.convert is not None:
            _keep_text_raw(ev.columns)
        return _library_images(ev.rows, op, name, self.convert)

    def _decoder(self, ev: Any, name: str) -> RowsDecoder | None:
        """The fast decoder of this table map, or None (no schema given, or a format it refuses)."""
        schema = self.schemas.get(name)
        if schema is None:
            return None
        try:
            return RowsDecoder(name, ev.columns, schema, self.added_columns.get(name, ()), self.key_columns.get(name),
                               self.renamed_columns.get(name), self.added_defaults.get(name))  # fmt: skip
        except UnsupportedRowFormat as exc:
            log.info("%s: decoding with python-mysql-replication (%s)", name, exc)
            return None

    def _table_name(self, ev: Any) -> str | None:
        """'db.table' of a rows event's table if it is wanted (checking its column names), else None."""
        schema, table = ev.schema, ev.table
        if self.tables is not None and (schema, table) not in self.tables:
            return None
        name = str(TableId(schema, table))
        missing = [i for i, c in enumerate(ev.columns) if not c.name]
        if missing:
            raise BinlogReadError(
                f"binlog rows events of {name} carry no column names (columns {missing} unnamed): the source "
                "must log full row metadata. Set binlog_row_metadata=FULL (SET GLOBAL binlog_row_metadata='FULL' "
                "and in the server config; MySQL >= 8.0.14 / MariaDB >= 10.5); events written before the change "
                "stay unnamed, so start CDC (or re-snapshot) from an offset after it"
            )
        return name


def _has_all(bitmap: bytes, full: bytes) -> bool:
    """Whether a rows event's column bitmap has every bit of ``full`` set. The bits past the last
    column are padding: MariaDB writes them 0, MySQL (seen on 9.7.4) writes them 1."""
    return bitmap == full or (
        len(bitmap) == len(full) and all(b & f == f for b, f in zip(bitmap, full, strict=True))
    )


#: A character set name no Python codec has: python-mysql-replication then keeps a column's bytes.
_RAW_TEXT = "mysqlcdc-raw-bytes"
_TEXT_TYPES = frozenset({FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING, FIELD_TYPE.BLOB})


def _keep_text_raw(columns: Sequence[Any]) -> None:
    """Have python-mysql-replication hand text columns over as their bytes: it decodes them with
    Python's codec of the charset's name, which is often not the server's definition (MySQL latin1 is
    cp1252, sjis is not shift_jis, ...); the row converter decodes them as the server does
    (``mysql/charsets``). Set on each rows event: every TABLE_MAP event brings new column objects."""
    for c in columns:
        if c.type in _TEXT_TYPES and getattr(c, "character_set_name", None) is not None:
            c.character_set_name = _RAW_TEXT


def _library_images(rows: list[dict[str, Any]], op: str, name: str, convert: RowConverter | None) -> list[Any]:
    """python-mysql-replication's rows in the shape ``RowsDecoder.decode`` gives: (before, after)
    pairs for 'u', one image per row for 'c' and 'd'; converted when ``convert`` is given."""
    if op == "u":
        if convert is None:
            return [(r["before_values"], r["after_values"]) for r in rows]
        return [
            (convert(name, r["before_values"], r.get("before_none_sources")),
             convert(name, r["after_values"], r.get("after_none_sources")))
            for r in rows
        ]  # fmt: skip
    if convert is None:
        return [r["values"] for r in rows]
    return [convert(name, r["values"], r.get("none_sources")) for r in rows]


__all__ = ["RowConverter", "TableMaps"]
