"""What Airflow 3's trigger form does with a DAG's params, for tests that must behave like a UI user.

Read from the installed UI (``airflow/ui/dist``, Airflow 3.3.2; ``FlexibleForm``): the form gets the
params from ``GET /api/v2/dags/<id>/details`` (each ``{"value", "schema", "description"}``), marks a
field required — red asterisk, "This field is required" when it is empty, Trigger disabled — when its
schema has a ``type`` that is not a list containing ``"null"`` (``isRequired``), and sends as the
run's conf every param's current value (``setParamsDict``: ``{name: value}``). A cleared text field
sends ``null``, so a param whose default is empty must allow null to be left empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def form_required(schema: Mapping[str, Any]) -> bool:
    """The UI's ``isRequired``: a typed schema whose type list does not include ``"null"``."""
    kind = schema.get("type")
    return bool(kind) and (not isinstance(kind, list) or "null" not in kind)


def is_empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def required_but_empty(params: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Params (as the details endpoint dumps them) the form would refuse to trigger with at their defaults."""
    return sorted(name for name, p in params.items() if form_required(p.get("schema") or {}) and is_empty(p["value"]))


def default_conf(params: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The conf the form sends when the user changes nothing: every param with its default value."""
    return {name: p["value"] for name, p in params.items()}


def dumped_params(dag: Any) -> dict[str, dict[str, Any]]:
    """``dag``'s params the way the api-server's details endpoint returns them (serialized, then dumped)."""
    from airflow.serialization.serialized_objects import DagSerialization

    served = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    return {name: dict(p.dump()) for name, p in served.params.items()}


__all__ = ["default_conf", "dumped_params", "form_required", "is_empty", "required_but_empty"]
