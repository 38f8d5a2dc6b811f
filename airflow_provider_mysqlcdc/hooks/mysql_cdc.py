"""MySqlCdcHook: the Airflow face of a CDC source (connection type ``mysql_cdc``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pymysql

from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableId, TableSchema
from airflow_provider_mysqlcdc.get_provider_info import CONN_FIELDS
from airflow_provider_mysqlcdc.mysql import server
from airflow_provider_mysqlcdc.mysql.checks import SourceReport, check_source
from airflow_provider_mysqlcdc.mysql.connection import DEFAULT_SERVER_ID_RANGE, ConnectionSettings
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema

try:  # Airflow 3
    from airflow.sdk import BaseHook
except ImportError:  # pragma: no cover - Airflow 2.x
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]


# The connection's three TLS modes (extra ``ssl``), as stored and as shown in the form. They map to
# ConnectionSettings.ssl: None = use TLS when the server offers it, True = require it, False = off.
SSL_PREFERRED, SSL_REQUIRED, SSL_DISABLED = "preferred", "required", "disabled"
SSL_MODES: dict[str, str] = {
    SSL_PREFERRED: "preferred (use TLS when the server offers it)",
    SSL_REQUIRED: "required",
    SSL_DISABLED: "disabled",
}
# Older spellings keep working: the toggle stored true/false (JSON booleans or strings).
_SSL_WORDS: dict[str, bool | None] = {
    **dict.fromkeys(("preferred", "prefer", "auto", "default"), None),
    **dict.fromkeys(("required", "require", "true", "1", "yes", "on"), True),
    **dict.fromkeys(("disabled", "disable", "false", "0", "no", "off"), False),
}


def parse_ssl(v: Any) -> bool | None:
    """The ``ssl`` extra as ``ConnectionSettings.ssl``: a mode name, its label, or an old true/false.

    Absent or empty means preferred, so connections saved before the three modes keep their meaning.
    """
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    s = s.split(" (", 1)[0].strip()  # a form label, e.g. "preferred (use TLS when the server offers it)"
    if s in _SSL_WORDS:
        return _SSL_WORDS[s]
    raise ValueError(
        f"connection extra 'ssl' must be one of {', '.join(SSL_MODES)} (or true/false), got {v!r}: "
        "edit the connection's TLS field"
    )


def ssl_mode(ssl: bool | None) -> str:
    """The mode name of a ``ConnectionSettings.ssl`` value (what the form shows for a stored value)."""
    return SSL_PREFERRED if ssl is None else SSL_REQUIRED if ssl else SSL_DISABLED


class _SslSelectWidget:
    """Renders the ``ssl`` StringField as a <select> of the three modes: Airflow's form accepts only
    String/Integer/Password/Boolean fields, and a toggle cannot go back to "preferred"."""

    def __call__(self, field: Any, **kwargs: Any) -> Any:
        from markupsafe import Markup, escape

        try:
            current = ssl_mode(parse_ssl(field.data))
        except ValueError:
            current = SSL_PREFERRED
        kwargs.setdefault("id", field.id)
        kwargs.setdefault("class", "form-control")
        attrs = " ".join(
            str(escape(k.rstrip("_"))) if v is True else f'{escape(k.rstrip("_"))}="{escape(v)}"'
            for k, v in {"name": field.name, **kwargs}.items()
            if v is not False and v is not None
        )
        options = "".join(
            f'<option value="{escape(value)}"{" selected" if value == current else ""}>{escape(label)}</option>'
            for value, label in SSL_MODES.items()
        )
        return Markup(f"<select {attrs}>{options}</select>")


def _validate_ssl(form: Any, field: Any) -> None:
    """Form validator: refuse a value :func:`parse_ssl` would refuse when a job starts."""
    from wtforms.validators import ValidationError

    try:
        parse_ssl(field.data)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def _parse_range(v: Any) -> tuple[int, int]:
    if v is None or v == "":
        return DEFAULT_SERVER_ID_RANGE
    if isinstance(v, list | tuple) and len(v) == 2:
        return int(v[0]), int(v[1])
    lo, sep, hi = str(v).partition("-")
    if not sep:
        raise ValueError(f"connection extra 'server_id_range' must look like 5400-6400, got {v!r}")
    return int(lo), int(hi)


def settings_from_connection(conn: Any) -> ConnectionSettings:
    """Turn an Airflow Connection into plain :class:`ConnectionSettings` (what Spark jobs receive)."""
    extra = conn.extra_dejson or {}
    return ConnectionSettings(
        host=conn.host or "127.0.0.1",
        port=int(conn.port or 3306),
        user=conn.login or "root",
        password=conn.password or "",
        database=conn.schema or None,
        ssl=parse_ssl(extra.get("ssl")),
        ssl_ca=extra.get("ssl_ca") or None,
        server_id_range=_parse_range(extra.get("server_id_range")),
    )


class MySqlCdcHook(BaseHook):
    """Connects to a MySQL/MariaDB CDC source: offsets, source checks, table schemas.

    :param mysql_cdc_conn_id: the ``mysql_cdc`` connection (host, port, login, password, optional
        default database; extras ``ssl`` (``preferred``, ``required`` or ``disabled``; old true/false
        values still work), ``ssl_ca``, ``server_id_range``).
    """

    conn_name_attr = "mysql_cdc_conn_id"
    default_conn_name = "mysql_cdc_default"
    conn_type = "mysql_cdc"
    hook_name = "MySQL CDC"

    def __init__(self, mysql_cdc_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mysql_cdc_conn_id = mysql_cdc_conn_id
        self._settings: ConnectionSettings | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Default database (optional)"},
            "placeholders": {"host": "mysql.example.com", "port": "3306", "login": "cdc"},
        }

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """Form widgets for the custom extras (Airflow 2 style UI; Airflow 3 reads ``conn-fields``).

        ``ssl`` is a three-way select (preferred / required / disabled), a StringField underneath
        because Airflow refuses other field classes.
        """
        try:
            from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
            from flask_babel import lazy_gettext
            from wtforms import StringField
        except ImportError:  # Airflow 3 without the FAB provider: conn-fields in provider info apply
            return {}
        return {
            "ssl": StringField(
                lazy_gettext(CONN_FIELDS["ssl"]["label"]),
                widget=_SslSelectWidget(),
                validators=[_validate_ssl],
                default=SSL_PREFERRED,
                description=" / ".join(SSL_MODES.values()),
            ),
            "ssl_ca": StringField(lazy_gettext(CONN_FIELDS["ssl_ca"]["label"]), widget=BS3TextFieldWidget()),
            "server_id_range": StringField(
                lazy_gettext(CONN_FIELDS["server_id_range"]["label"]),
                widget=BS3TextFieldWidget(),
                default="5400-6400",
            ),
        }

    # ------------------------------------------------------------------ settings
    @property
    def settings(self) -> ConnectionSettings:
        if self._settings is None:
            self._settings = settings_from_connection(self.get_connection(self.mysql_cdc_conn_id))
        return self._settings

    def get_conn(self) -> pymysql.connections.Connection:
        return self.settings.connect()

    @contextlib.contextmanager
    def connection(self) -> Iterator[pymysql.connections.Connection]:
        conn = self.get_conn()
        try:
            yield conn
        finally:
            conn.close()

    def test_connection(self) -> tuple[bool, str]:
        """Used by the UI's "Test" button: connects and runs the server-level checks."""
        try:
            report = self.check_source([])
        except Exception as exc:
            return False, str(exc)
        return report.ok, report.summary()

    # ------------------------------------------------------------------ source facts
    def current_offset(self) -> BinlogOffset:
        with self.connection() as conn:
            return server.current_offset(conn)

    def check_source(
        self, tables: list[str] | None = None, chunk_key_columns: dict[str, list[str]] | None = None
    ) -> SourceReport:
        with self.connection() as conn:
            return check_source(conn, tables, chunk_key_columns)

    def table_schema(self, table: str) -> TableSchema:
        with self.connection() as conn:
            return read_table_schema(conn, TableId.parse(table))

    def ensure_offset_available(self, offset: BinlogOffset) -> None:
        with self.connection() as conn:
            server.ensure_offset_available(conn, offset)
