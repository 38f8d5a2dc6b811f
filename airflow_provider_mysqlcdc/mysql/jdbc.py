"""Spark JDBC connection details for the source: URL, options and properties (Connector/J 2.7)."""

from __future__ import annotations

from typing import Any

MARIADB_JDBC_DRIVER = "org.mariadb.jdbc.Driver"

#: Connector/J 2.7 options for JDBC reads of this package:
#:
#: * ``sessionVariables=time_zone='+00:00'`` — TIMESTAMP columns are rendered in the session
#:   zone; UTC makes them the instant the binlog carries. The value must *not* be URL-encoded
#:   (Connector/J 2.7 sends ``%2B00:00`` literally and the connect fails).
#: * ``useLegacyDatetimeCode=false`` + ``serverTimezone=UTC`` — the driver builds
#:   ``java.sql.Timestamp`` from the wall time in UTC instead of the executor JVM's default zone
#:   (else DATETIME shifts by the JVM's offset: 5 h on an America/New_York JVM).
#: * ``tinyInt1isBit=false`` — otherwise TINYINT(1) arrives as BOOLEAN and 2..127 become true.
#: * ``yearIsDateType=false`` — otherwise YEAR arrives as a DATE (Jan 1st of the year).
#:
#: The snapshot's :func:`~core.projection.jdbc_read` projection sends temporal values as integers, so its values no
#: longer depend on the first three (nor on the JVM's zone); they stay for any read of a plain
#: column, where each one changes a value when absent.
JDBC_URL_OPTIONS: dict[str, str] = {
    "sessionVariables": "time_zone='+00:00'",
    "useLegacyDatetimeCode": "false",
    "serverTimezone": "UTC",
    "tinyInt1isBit": "false",
    "yearIsDateType": "false",
}


def jdbc_url(settings: Any, database: str | None = None) -> str:
    """``jdbc:mysql://host:port/[db]?<JDBC_URL_OPTIONS>`` for Connector/J 2.7 (MariaDB driver).

    ``jdbc:mysql:`` (not ``jdbc:mariadb:``) so the same URL also works against MySQL servers;
    Connector/J 2.x accepts it. TLS follows ``settings.ssl``: True -> ``useSsl=true`` (verifying
    against ``ssl_ca`` when given, else trusting the server certificate, as the PyMySQL path does);
    None/False -> no TLS (Connector/J 2.7 has no "use TLS if offered" mode).
    """
    db = database if database is not None else (getattr(settings, "database", None) or "")
    opts = dict(JDBC_URL_OPTIONS)
    if getattr(settings, "ssl", None) is True:
        opts["useSsl"] = "true"
        ca = getattr(settings, "ssl_ca", None)
        if ca:
            opts["serverSslCert"] = str(ca)
        else:
            opts["trustServerCertificate"] = "true"
    query = "&".join(f"{k}={v}" for k, v in opts.items())
    return f"jdbc:mysql://{settings.host}:{int(settings.port)}/{db}?{query}"


def jdbc_properties(settings: Any) -> dict[str, str]:
    """Connection properties for ``spark.read.jdbc``: login, the MariaDB driver class, timeout.

    The password travels in properties, not in the URL, so Spark's redacted URL logs never show it.
    """
    props = {
        "user": str(settings.user),
        "password": str(settings.password or ""),
        "driver": MARIADB_JDBC_DRIVER,
    }
    timeout = getattr(settings, "connect_timeout", None)
    if timeout:
        props["connectTimeout"] = str(int(timeout) * 1000)
    return props
