"""Look for secret strings where they must never appear: process argv, Spark's environment page, files.

Each ``scan_*`` function returns the ``Finding``s — where each secret was found; an empty list
means clean. The searching is pure (``scan_argvs``, ``scan_document``, ``scan_text``) and unit-tested
on plain data; the thin readers next to them gather the real inputs:

* ``process_argvs()`` — the argv of every process on the machine (``/proc/<pid>/cmdline``);
  anyone on the host can read these, so a password on a command line is a leak.
* ``spark_environment(ui_url, app_id)`` — a running application's
  ``/api/v1/applications/<app id>/environment`` (Spark properties, system properties, classpath…);
  anyone who can reach the UI (or the master UI's proxy) reads it.
* files under a directory (Spark event logs, Airflow task logs): ``scan_directory``.

A finding names the secret by a masked form (first 4 characters), so an assertion message that
prints findings does not repeat the secret in full.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Finding:
    secret: str  # masked: the first characters and the length
    where: str

    def __str__(self) -> str:
        return f"{self.secret} in {self.where}"


def mask(secret: str) -> str:
    return f"{secret[:4]}…({len(secret)} chars)"


def _checked(secrets: Iterable[str]) -> list[str]:
    out = list(secrets)
    for s in out:
        if len(s) < 8:
            # a short "secret" matches by accident and hides real results in noise
            raise ValueError(f"refusing to scan for a secret shorter than 8 characters: {mask(s)}")
    return out


# ---------------------------------------------------------------- pure searches
def scan_text(secrets: Iterable[str], text: str, where: str) -> list[Finding]:
    """Findings for each secret in ``text``, by line number (1-based)."""
    found = []
    for secret in _checked(secrets):
        if secret not in text:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if secret in line:
                found.append(Finding(mask(secret), f"{where}:{lineno}"))
    return found


def scan_argvs(secrets: Iterable[str], argvs: Mapping[int, Sequence[str]]) -> list[Finding]:
    """Findings in process argument vectors ``{pid: argv}`` (the secret inside any argument)."""
    wanted = _checked(secrets)
    found = []
    for pid, argv in sorted(argvs.items()):
        for i, arg in enumerate(argv):
            for secret in wanted:
                if secret in arg:
                    prog = Path(argv[0]).name if argv else "?"
                    found.append(Finding(mask(secret), f"pid {pid} ({prog}) argv[{i}]"))
    return found


def scan_document(secrets: Iterable[str], doc: Any, where: str = "$") -> list[Finding]:
    """Findings in a JSON-like document (dicts, lists, strings): keys and values, by path."""
    wanted = _checked(secrets)
    found: list[Finding] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(k, f"{path}<key>")
                walk(v, f"{path}[{k!r}]")
        elif isinstance(node, list | tuple):
            # Spark's environment lists properties as [name, value] pairs: name the pair by its key
            if len(node) == 2 and isinstance(node[0], str) and not isinstance(node[1], list | dict):
                walk(node[0], f"{path}[{node[0]!r}]")
                walk(node[1], f"{path}[{node[0]!r}]")
                return
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif node is not None:
            text = node if isinstance(node, str) else str(node)
            for secret in wanted:
                if secret in text:
                    found.append(Finding(mask(secret), path))

    walk(doc, where)
    return sorted(set(found), key=lambda f: (f.where, f.secret))


# ---------------------------------------------------------------- readers
def process_argvs(proc: str | Path = "/proc") -> dict[int, list[str]]:
    """``{pid: argv}`` of every process readable under ``proc`` (processes that exit meanwhile are skipped)."""
    out = {}
    for entry in Path(proc).iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        out[int(entry.name)] = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    return out


def scan_processes(secrets: Iterable[str], proc: str | Path = "/proc") -> list[Finding]:
    return scan_argvs(secrets, process_argvs(proc))


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def spark_environment(ui_url: str, app_id: str | None = None, timeout: float = 10.0) -> tuple[str, Any]:
    """``(app id, environment document)`` of a running application from its UI (driver UI, or
    ``<master ui>/proxy/<app id>`` with ``spark.ui.reverseProxy``); ``app_id=None`` takes the UI's only app."""
    base = ui_url.rstrip("/")
    if app_id is None:
        apps = _get_json(f"{base}/api/v1/applications", timeout)
        if len(apps) != 1:
            raise ValueError(f"{base} serves {len(apps)} applications: pass app_id")
        app_id = str(apps[0]["id"])
    return app_id, _get_json(f"{base}/api/v1/applications/{app_id}/environment", timeout)


def scan_spark_environment(
    secrets: Iterable[str], ui_url: str, app_id: str | None = None, timeout: float = 10.0
) -> list[Finding]:
    app_id, env = spark_environment(ui_url, app_id, timeout)
    return scan_document(secrets, env, f"{app_id}/environment")


def scan_directory(secrets: Iterable[str], root: str | Path) -> list[Finding]:
    """Findings in every file under ``root`` (binary files too: the bytes are decoded leniently)."""
    wanted = _checked(secrets)
    found = []
    for path in sorted(Path(root).rglob("*")):
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(s.encode() in data for s in wanted):
            found += scan_text(wanted, data.decode(errors="replace"), str(path))
    return found
