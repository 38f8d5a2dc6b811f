"""Stand-ins for the OpenLineage provider's classes, for checking lineage where it is not installed."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class Dataset:
    namespace: str
    name: str


@dataclass
class OperatorLineage:
    inputs: list[Any] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``airflow.providers.openlineage.extractors.OperatorLineage`` and the compat ``Dataset`` these."""
    import airflow.providers.common.compat.openlineage.facet as facet

    extractors = types.ModuleType("airflow.providers.openlineage.extractors")
    extractors.OperatorLineage = OperatorLineage  # type: ignore[attr-defined]
    package = types.ModuleType("airflow.providers.openlineage")
    package.extractors = extractors  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow.providers.openlineage", package)
    monkeypatch.setitem(sys.modules, "airflow.providers.openlineage.extractors", extractors)
    monkeypatch.setattr(facet, "Dataset", Dataset)


def installed() -> bool:
    """Whether the real OpenLineage provider is installed."""
    try:
        import airflow.providers.openlineage.extractors  # noqa: F401
    except ImportError:
        return False
    return True
