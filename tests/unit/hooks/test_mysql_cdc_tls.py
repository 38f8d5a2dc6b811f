"""The connection's three-state TLS extra: new mode names, form labels, and every older spelling."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_mysqlcdc.hooks.mysql_cdc import (
    SSL_MODES,
    _SslSelectWidget,
    parse_ssl,
    settings_from_connection,
    ssl_mode,
)


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        # the three modes of the select, by value and by label
        ("preferred", None),
        ("required", True),
        ("disabled", False),
        ("preferred (use TLS when the server offers it)", None),
        ("  Required ", True),
        ("DISABLED", False),
        # absent or empty: preferred, as before the select existed
        (None, None),
        ("", None),
        # what the old toggle and hand-written extras stored
        (True, True),
        (False, False),
        ("true", True),
        ("false", False),
        ("True", True),
        ("1", True),
        ("0", False),
        (1, True),
        (0, False),
        ("yes", True),
        ("off", False),
        ("require", True),
        ("disable", False),
    ],
)
def test_parse_ssl(stored: Any, expected: bool | None) -> None:
    assert parse_ssl(stored) is expected


@pytest.mark.parametrize("bad", ["verify", "maybe", "2", "tls"])
def test_an_unknown_value_names_the_modes(bad: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_ssl(bad)
    msg = str(err.value)
    assert repr(bad) in msg and "preferred, required, disabled" in msg and "TLS field" in msg


def test_each_mode_round_trips() -> None:
    assert list(SSL_MODES) == ["preferred", "required", "disabled"]
    for mode, label in SSL_MODES.items():
        assert ssl_mode(parse_ssl(mode)) == mode
        assert ssl_mode(parse_ssl(label)) == mode


def _conn(extra: dict[str, Any] | None) -> Any:
    return SimpleNamespace(
        host="db", port=3307, login="cdc", password="pw", schema="", extra_dejson=extra,
    )


@pytest.mark.parametrize(
    ("extra", "ssl", "kwargs"),
    [
        ({"ssl": "preferred"}, None, {}),
        ({}, None, {}),
        (None, None, {}),
        ({"ssl": "required"}, True, {"ssl": {"check_hostname": False}, "ssl_verify_cert": False}),
        ({"ssl": "required", "ssl_ca": "/ca.pem"}, True, {"ssl": {"ca": "/ca.pem"}, "ssl_verify_cert": True}),
        ({"ssl": "disabled"}, False, {"ssl_disabled": True}),
        ({"ssl": True}, True, {"ssl": {"check_hostname": False}, "ssl_verify_cert": False}),
        ({"ssl": "false"}, False, {"ssl_disabled": True}),
    ],
)
def test_settings_from_connection_maps_the_mode(
    extra: dict[str, Any] | None, ssl: bool | None, kwargs: dict[str, Any]
) -> None:
    settings = settings_from_connection(_conn(extra))
    assert settings.ssl is ssl
    kw = settings.connect_kwargs()
    tls_keys = {k: kw[k] for k in ("ssl", "ssl_verify_cert", "ssl_disabled") if k in kw}
    assert tls_keys == kwargs  # preferred passes nothing: PyMySQL then uses TLS if the server offers it
    # the settings travel to Spark jobs as JSON and keep the mode
    assert type(settings).from_dict(json.loads(json.dumps(settings.to_dict()))).ssl is ssl


def test_a_bad_stored_value_fails_with_the_fix() -> None:
    with pytest.raises(ValueError, match="edit the connection's TLS field"):
        settings_from_connection(_conn({"ssl": "sometimes"}))


@pytest.mark.parametrize(("data", "selected"), [(None, "preferred"), (False, "disabled"), ("true", "required"),
                                                ("garbage", "preferred")])
def test_the_form_widget_is_a_select_of_the_three_modes(data: Any, selected: str) -> None:
    field = SimpleNamespace(id="extra__mysql_cdc__ssl", name="extra__mysql_cdc__ssl", data=data)
    html = str(_SslSelectWidget()(field))
    assert html.startswith('<select name="extra__mysql_cdc__ssl" id="extra__mysql_cdc__ssl" class="form-control">')
    for mode, label in SSL_MODES.items():
        option = f'<option value="{mode}"{" selected" if mode == selected else ""}>{label}</option>'
        assert option in html
    assert html.count(" selected") == 1
