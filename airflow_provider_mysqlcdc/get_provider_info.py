"""Provider registry entry (entry point group ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from airflow_provider_mysqlcdc import __version__

# Custom connection fields, shared by the provider info (Airflow 3 UI) and the hook's form widgets.
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "ssl": {
        "label": "TLS",
        "description": "preferred = use TLS when the server offers it; required = refuse plain TCP; disabled = "
        "plain TCP (old true/false values still work)",
        "schema": {
            "type": ["string", "null"],
            "enum": ["preferred", "required", "disabled"],
            "values_display": {
                "preferred": "preferred (use TLS when the server offers it)",
                "required": "required",
                "disabled": "disabled",
            },
            "default": "preferred",
        },
    },
    "ssl_ca": {
        "label": "TLS CA file",
        "description": "Path of the CA certificate used to verify the server (enables verification)",
        "schema": {"type": ["string", "null"]},
    },
    "server_id_range": {
        "label": "Replication server_id range",
        "description": "lo-hi; each binlog reader takes its own server_id from it: at least stream readers + "
        "parallel snapshot groups ids (default 5400-6400)",
        "schema": {"type": ["string", "null"], "default": "5400-6400"},
    },
}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-mysqlcdc",
        "name": "MySQL CDC",
        "description": "Lock-free MySQL/MariaDB change data capture on Spark (watermark-bracketed snapshot "
        "+ binlog streaming) into Delta Lake.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "MySQL CDC",
                "external-doc-url": "https://github.com/airflow-provider-mysqlcdc/airflow-provider-mysqlcdc",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "MySQL CDC",
                "python-modules": ["airflow_provider_mysqlcdc.hooks.mysql_cdc"],
            }
        ],
        "operators": [
            {
                "integration-name": "MySQL CDC",
                "python-modules": [
                    "airflow_provider_mysqlcdc.operators.plan",
                    "airflow_provider_mysqlcdc.operators.snapshot",
                    "airflow_provider_mysqlcdc.operators.stream",
                    "airflow_provider_mysqlcdc.operators.verify",
                ],
            }
        ],
        "sensors": [
            {"integration-name": "MySQL CDC", "python-modules": ["airflow_provider_mysqlcdc.sensors.stream"]}
        ],
        "triggers": [
            {"integration-name": "MySQL CDC", "python-modules": ["airflow_provider_mysqlcdc.triggers.stream"]}
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_mysqlcdc.hooks.mysql_cdc.MySqlCdcHook",
                "hook-name": "MySQL CDC",
                "connection-type": "mysql_cdc",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Default database (optional)"},
                    "placeholders": {"host": "mysql.example.com", "port": "3306", "login": "cdc"},
                },
                "conn-fields": CONN_FIELDS,
            }
        ],
    }
