"""How to reach the source server: plain settings that travel from Airflow to Spark jobs.

The Airflow hook resolves a connection id into :class:`ConnectionSettings`; Spark jobs receive
the same settings as JSON (they cannot resolve Airflow connections on an executor). Keeping this
free of Airflow lets Spark executors and the CLI use it too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pymysql

DEFAULT_SERVER_ID_RANGE = (5400, 6400)


class SourceConnectionError(RuntimeError):
    """The source server cannot be reached or refused the login."""


@dataclass
class ConnectionSettings:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = field(default="", repr=False)
    database: str | None = None
    # TLS: None = PyMySQL's default (use TLS if the server offers it), True = require,
    # False = off. A TLS connect builds an SSL context each time, which is slow enough that the local
    # test server runs with it off (docs/architecture.md, "Pitfalls").
    ssl: bool | None = None
    ssl_ca: str | None = None
    server_id_range: tuple[int, int] = DEFAULT_SERVER_ID_RANGE
    connect_timeout: int = 10

    def connect_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "host": self.host,
            "port": int(self.port),
            "user": self.user,
            "password": self.password,
            "charset": "utf8mb4",
            "connect_timeout": self.connect_timeout,
            "autocommit": True,
            # Every session reads and writes TIMESTAMP in UTC, on every path (JDBC does the same).
            "init_command": "SET time_zone = '+00:00'",
        }
        if self.database:
            kw["database"] = self.database
        if self.ssl is False:
            kw["ssl_disabled"] = True
        elif self.ssl is True:
            kw["ssl"] = {"ca": self.ssl_ca} if self.ssl_ca else {"check_hostname": False}
            kw["ssl_verify_cert"] = bool(self.ssl_ca)
        return kw

    def connect(self, **overrides: Any) -> pymysql.connections.Connection:
        """A connection to the source; the process then orders the keys of collations only the
        server can order (``server`` method) by this source (``mysql/collation.use_server_weights``),
        and decodes binlog text in sets Python cannot decode exactly by its tables
        (``mysql/charsets.use_server_charsets``)."""
        from airflow_provider_mysqlcdc.mysql.charsets import use_server_charsets
        from airflow_provider_mysqlcdc.mysql.collation import use_server_weights

        kw = self.connect_kwargs()
        kw.update(overrides)
        use_server_weights(self)
        use_server_charsets(self)
        try:
            return pymysql.connect(**kw)
        except pymysql.err.OperationalError as exc:
            code = exc.args[0] if exc.args else None
            if code == 1045:
                raise SourceConnectionError(
                    f"MySQL at {self.host}:{self.port} refused login for user {self.user!r}: check the "
                    "connection's login and password"
                ) from exc
            raise SourceConnectionError(
                f"cannot connect to MySQL at {self.host}:{self.port}: {exc.args[-1] if exc.args else exc}. "
                "Check the connection's host/port and that the server is running and reachable"
            ) from exc

    def replication_settings(self) -> dict[str, Any]:
        """Keyword arguments for pymysqlreplication's ``connection_settings``."""
        kw = self.connect_kwargs()
        kw.pop("autocommit", None)
        kw.pop("init_command", None)
        kw.pop("database", None)
        kw["passwd"] = kw.pop("password")
        return kw

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["server_id_range"] = list(self.server_id_range)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConnectionSettings:
        d = dict(d)
        if "server_id_range" in d and d["server_id_range"] is not None:
            d["server_id_range"] = tuple(int(x) for x in d["server_id_range"])
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})
