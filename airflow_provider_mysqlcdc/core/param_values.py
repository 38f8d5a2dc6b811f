"""Turning one parameter's value into a typed value, or into a problem naming what to give instead.

Why a module of its own: a DAG param arrives as a Python value, as JSON text, or as the text a
template rendered, and each kind of value (a table list, a flag, a number, per-table conditions, a
time, an offset) is read the same way wherever it appears; ``core/config.py`` combines them into a
:class:`~airflow_provider_mysqlcdc.core.config.PipelineConfig` and checks how they fit together.
Each reader appends what is wrong to ``problems`` instead of raising, so every problem is reported
at once. Pure: no Airflow, no connections.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from airflow_provider_mysqlcdc.core.table_selection import TablePattern

TABLE_NAME = re.compile(r"^`?[^`.\s]+`?\.`?[^`.\s]+`?$")


def given_value(params: dict[str, Any], name: str, default: Any) -> Any:
    """``params[name]``, or ``default`` when it is missing, None or empty text (an unset template)."""
    v = params.get(name)
    return default if v is None or (isinstance(v, str) and not v.strip()) else v


def unknown_keys_problem(given: Iterable[str], known: Iterable[str], dag_id: str = "the DAG") -> str | None:
    """The one message for a run conf with keys that are not params (None if every key is one).

    Why refuse: Airflow passes unknown conf keys through silently, so a typo (``tabels``) runs the
    default of the param it meant — on tables nobody asked for."""
    params = sorted(set(known))
    unknown = [k for k in sorted(set(given)) if k not in params]
    if not unknown:
        return None
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, params, n=1, cutoff=0.6)
        named.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return (
        f"the run's conf has {', '.join(named)}, which {'is not a param' if len(named) == 1 else 'are not params'} "
        f"of {dag_id}: nothing was run. Trigger it again with the keys spelled as its params: {', '.join(params)}"
    )


def norm_table(t: str) -> str:
    return t.strip().replace("`", "")


def table_list(name: str, value: Any, problems: list[str], patterns: bool = False) -> list[str]:
    """Table names (or, with ``patterns``, names and patterns) from a list or its text form: a JSON
    list, or entries separated by commas (a regular expression containing a comma needs the JSON
    list form)."""
    if isinstance(value, str):  # a templated field rendered as text: JSON list or comma-separated
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                value = [v.strip(" '\"") for v in text.strip("[]").split(",")]
        else:
            value = [v for v in text.split(",")]
    if not isinstance(value, list | tuple):
        problems.append(f"{name} must be a list of <database>.<table>, got {value!r}")
        return []
    out: list[str] = []
    for v in value:
        if patterns and isinstance(v, str) and v.strip():
            try:
                t = TablePattern.parse(v).text
            except ValueError as exc:
                problems.append(f"{name}: {exc}")
                continue
            if t not in out:
                out.append(t)
            continue
        if not isinstance(v, str) or not TABLE_NAME.match(v.strip()):
            problems.append(f"{name}: {v!r} is not a table name written as <database>.<table>")
            continue
        t = norm_table(v)
        if t not in out:
            out.append(t)
    return out


def bool_value(name: str, value: Any, problems: list[str]) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if value is None:
        return False
    if not isinstance(value, bool):
        problems.append(f"{name} must be true or false, got {value!r}")
        return False
    return value


def int_value(name: str, value: Any, minimum: int, maximum: int | None, problems: list[str]) -> int | None:
    if isinstance(value, bool):
        problems.append(f"{name} must be an integer, got {value!r}")
        return None
    try:
        n = int(str(value).strip()) if isinstance(value, str) else int(value)
        if isinstance(value, float) and value != n:
            raise ValueError
    except (TypeError, ValueError):
        problems.append(f"{name} must be an integer, got {value!r}")
        return None
    if n < minimum or (maximum is not None and n > maximum):
        bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        problems.append(f"{name} must be {bound}, got {n}")
        return None
    return n


def repair_chunks_value(value: Any, problems: list[str]) -> dict[str, list[int]]:
    """``{"db.t": [chunk ids]}`` (what ``verify`` reports as differing_chunks), or its JSON text."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            problems.append(f"repair_chunks must be a JSON object like {{\"shop.orders\": [3, 7]}}, got {value!r}")
            return {}
    if not isinstance(value, dict):
        problems.append(f"repair_chunks must map <database>.<table> to chunk numbers, got {value!r}")
        return {}
    out: dict[str, list[int]] = {}
    for table, ids in value.items():
        if not isinstance(table, str) or not TABLE_NAME.match(table.strip()):
            problems.append(f"repair_chunks: {table!r} is not a table name written as <database>.<table>")
            continue
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                            for i in ids):  # fmt: skip
            problems.append(f"repair_chunks[{table!r}] must be a non-empty list of chunk numbers (>= 0, as verify "
                            f"prints them), got {ids!r}")  # fmt: skip
            continue
        out[norm_table(table)] = sorted(set(ids))
    return out


def snapshot_filters_value(value: Any, problems: list[str]) -> dict[str, str]:
    """``{"db.t": "<SQL condition>"}``, or its JSON text. The condition is checked here only for what
    would break the query around it; the plan asks the server to parse it (``EXPLAIN``)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    example = "{\"shop.orders\": \"created_at >= '2026-01-01'\"}"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            problems.append(f"snapshot_filters must be a JSON object like {example}, got {value!r}")
            return {}
    if not isinstance(value, dict):
        problems.append(f"snapshot_filters must map <database>.<table> to a SQL condition, e.g. {example}, "
                        f"got {value!r}")  # fmt: skip
        return {}
    out: dict[str, str] = {}
    for table, cond in value.items():
        if not isinstance(table, str) or not TABLE_NAME.match(table.strip()):
            problems.append(f"snapshot_filters: {table!r} is not a table name written as <database>.<table>")
            continue
        why = condition_problem(cond)
        if why:
            problems.append(f"snapshot_filters[{table!r}] {why}")
            continue
        out[norm_table(table)] = str(cond).strip()
    return out


def condition_problem(cond: Any) -> str | None:
    """What makes ``cond`` unusable as one WHERE condition (None if nothing does)."""
    if not isinstance(cond, str) or not cond.strip():
        return f"must be a non-empty SQL condition such as \"status = 'late'\", got {cond!r}"
    text = cond.strip()
    bare = re.sub(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`", "''", text)  # literals emptied
    if ";" in bare or "--" in bare or "/*" in bare or "#" in bare:
        return f"must be one condition without ';' or comments, got {text!r}"
    depth = 0
    for ch in bare:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            break
    if depth != 0:
        return f"has unbalanced parentheses: {text!r}"
    return None


def timestamp_value(value: Any, problems: list[str]) -> float | None:
    """Epoch seconds from epoch seconds (number or text) or ISO 8601 text; no zone means UTC."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        problems.append(f"startup_timestamp must be an ISO 8601 time or epoch seconds, got {value!r}")
        return None
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        problems.append(
            f"startup_timestamp {text!r} is neither an ISO 8601 time (2026-11-24T10:00:00Z) nor epoch seconds"
        )
        return None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


_UUID_TEXT = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GTID_TEXT = re.compile(rf"^(?:{_UUID_TEXT}:|\d+-\d+-\d+(?:,|$))")


def offset_text(text: str, problems: list[str]) -> dict[str, Any] | None:
    text = text.strip()
    if text.startswith("{"):
        try:
            d = json.loads(text)
            return d if isinstance(d, dict) else None
        except json.JSONDecodeError:
            pass
    if _GTID_TEXT.match(text):  # uuid:1-5 (MySQL) or 0-1-5 (MariaDB): a GTID set, not file:pos
        return {"gtid_set": text}
    file, sep, pos = text.rpartition(":")
    if sep and file and pos.strip().isdigit():
        return {"file": file.strip(), "pos": int(pos)}
    problems.append(f"specific_offset {text!r} is neither {{\"file\": ..., \"pos\": ...}}, 'file:pos' nor a GTID set")
    return None


__all__ = ["TABLE_NAME", "bool_value", "condition_problem", "given_value", "int_value", "norm_table", "offset_text",
           "repair_chunks_value", "snapshot_filters_value", "table_list", "timestamp_value",
           "unknown_keys_problem"]  # fmt: skip
