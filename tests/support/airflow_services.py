"""A real Airflow for tests: scheduler, dag-processor, triggerer and api-server as subprocesses.

``AirflowServices`` owns a private ``AIRFLOW_HOME`` (SQLite metadata DB, migrated with ``airflow db
migrate``), starts each component as a child process in its own process group with its output in
``<home>/service-logs/<name>.log``, and talks to the api-server's REST API (``/api/v2``) with a JWT
from SimpleAuthManager (``simple_auth_manager_all_admins``: ``GET /auth/token`` needs no
credentials). Connections are ``AIRFLOW_CONN_*`` variables of every component, as in a deployment
that keeps them in the environment or a secrets backend.

Configuration that matters (verified with Airflow 3.3.2):

* ``LocalExecutor`` on SQLite works; ``[core] parallelism`` bounds the task processes at once;
* every component must share ``[api_auth] jwt_secret`` (the scheduler signs the task tokens the
  api-server checks), and task processes find the Execution API through
  ``[core] execution_api_server_url`` — both set here, the api-server being on a free port;
* the example DAG's sensor is deferrable, so a triggerer is part of a working deployment;
* ``[dag_processor] refresh_interval`` / ``min_file_process_interval`` short, so the DAG appears fast.

``stop()`` sends SIGTERM to each process group, then SIGKILL; ``log_tails()`` shows each component's
log and the task logs under ``<home>/logs`` for a failure message.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.airflow_env import DAGS_FOLDER
from tests.support.mariadb import free_port

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class AirflowApiError(RuntimeError):
    pass


@dataclass
class AirflowServices:
    home: Path
    connections: dict[str, str] = field(default_factory=dict)  # conn id -> JSON
    extra_env: dict[str, str] = field(default_factory=dict)
    parallelism: int = 6
    dags_folder: Path = DAGS_FOLDER
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _token: str | None = None
    startup_seconds: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def service_log_dir(self) -> Path:
        return self.home / "service-logs"

    @property
    def task_log_dir(self) -> Path:
        return self.home / "logs"

    def env(self) -> dict[str, str]:
        """The environment of every component (and of anything that must act like an Airflow worker)."""
        # the test process's own Airflow settings (conftest: unit-test mode, its AIRFLOW_HOME) stay out
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        if not hasattr(self, "_jwt_secret"):
            self._jwt_secret = secrets.token_urlsafe(32)
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags_folder),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM=str(self.parallelism),
            AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.base_url}/execution/",
            AIRFLOW__API__BASE_URL=self.base_url,
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__API_AUTH__JWT_SECRET=self._jwt_secret,
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="10",
            AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
            AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="2",
            AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK="False",
            AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
        )
        for conn_id, value in self.connections.items():
            env[f"AIRFLOW_CONN_{conn_id.upper()}"] = value
        env.update(self.extra_env)
        return env

    # ---------------------------------------------------------------- lifecycle
    def airflow_cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def migrate(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(self.airflow_cmd("db", "migrate"), env=self.env(), capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        if proc.returncode:
            raise RuntimeError(f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")

    def start(self, timeout: float = 240.0) -> AirflowServices:
        t0 = time.monotonic()
        self.migrate()
        self.service_log_dir.mkdir(parents=True, exist_ok=True)
        env = self.env()
        try:
            for name in COMPONENTS:
                args = ("api-server", "--host", "127.0.0.1", "--port", str(self.port)) if name == "api-server" else (
                    name,)  # fmt: skip
                with open(self.service_log_dir / f"{name}.log", "ab") as logf:
                    self.procs[name] = subprocess.Popen(
                        self.airflow_cmd(*args), env=env, cwd=self.home, stdin=subprocess.DEVNULL, stdout=logf,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    )  # fmt: skip
            self.wait_healthy(t0 + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {proc.returncode}\n{self.log_tails()}")

    def wait_healthy(self, deadline: float) -> dict[str, Any]:
        """Until ``/api/v2/monitor/health`` reports the metadatabase, scheduler, triggerer and dag processor healthy."""
        last: object = None
        while time.monotonic() < deadline:
            self.check_running()
            try:
                health = self._request("GET", "/api/v2/monitor/health", auth=False)
                last = health
                if all(
                    (health.get(part) or {}).get("status") == "healthy"
                    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
                ):
                    return health
            except (OSError, AirflowApiError) as exc:
                last = exc
            time.sleep(0.5)
        raise RuntimeError(f"Airflow not healthy at {self.base_url}: {last}\n{self.log_tails()}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every component's process group, then SIGKILL what is left."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs = {}

    # ---------------------------------------------------------------- diagnostics
    def log_tails(self, n: int = 2500, task_logs: int = 8) -> str:
        parts = []
        for name in COMPONENTS:
            p = self.service_log_dir / f"{name}.log"
            if p.exists():
                parts.append(f"--- airflow {name} ({p}) ---\n{p.read_text(errors='replace')[-n:]}")
        logs = sorted(
            (p for p in self.task_log_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime
        ) if self.task_log_dir.exists() else []  # fmt: skip
        for p in logs[-task_logs:]:
            parts.append(f"--- task log {p.relative_to(self.task_log_dir)} ---\n{p.read_text(errors='replace')[-n:]}")
        return "\n".join(parts)

    @contextlib.contextmanager
    def logs_on_failure(self):  # type: ignore[no-untyped-def]
        """Print the components' and the latest task logs' tails if the body fails (pytest shows them)."""
        try:
            yield
        except BaseException:
            print(self.log_tails())
            raise

    # ---------------------------------------------------------------- REST API
    def token(self) -> str:
        if self._token is None:
            self._token = self._request("GET", "/auth/token", auth=False)["access_token"]
        return self._token

    def _request(self, method: str, path: str, body: Any = None, auth: bool = True, timeout: float = 30.0) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise AirflowApiError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}") from None
        return json.loads(raw) if raw else None

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return self._request(method, f"/api/v2{path}", body)

    def wait_dag(self, dag_id: str, timeout: float = 180.0) -> dict[str, Any]:
        """Until the dag-processor has serialized ``dag_id`` (import errors fail at once)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            errors = self.api("GET", "/importErrors")
            if errors.get("total_entries"):
                raise AssertionError(f"DAG import errors: {errors}")
            try:
                return self.api("GET", f"/dags/{dag_id}")
            except AirflowApiError as exc:
                if "404" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def unpause(self, dag_id: str) -> dict[str, Any]:
        return self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        """``POST /dags/<id>/dagRuns`` as the UI's trigger form does; the run id."""
        run = self.api("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
        return str(run["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.api("GET", f"/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}")["state"])

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 600.0, poll: float = 1.0) -> str:
        """Until the run is no longer queued or running; its final state."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            state = self.run_state(dag_id, run_id)
            if state not in ("queued", "running"):
                return state
            if time.monotonic() > deadline:
                states = self.task_states(dag_id, run_id)
                raise TimeoutError(f"run {run_id} still {state} after {timeout:.0f}s: {states}")
            time.sleep(poll)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        out = self.api("GET", f"/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}/taskInstances?limit=1000")
        return list(out["task_instances"])

    def task_states(self, dag_id: str, run_id: str) -> dict[tuple[str, int], str]:
        return {(t["task_id"], t["map_index"]): str(t["state"]) for t in self.task_instances(dag_id, run_id)}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        path = (f"/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}/taskInstances/{task_id}/xcomEntries/{key}"
                f"?map_index={map_index}&deserialize=true&stringify=false")  # fmt: skip
        value = self.api("GET", path)["value"]
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        return value
