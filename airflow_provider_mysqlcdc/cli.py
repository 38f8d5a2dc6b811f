"""Command line: pre-flight checks and plans outside Airflow (``python -m airflow_provider_mysqlcdc``).

The connection is resolved the way ``airflow connections get`` resolves it (a secrets backend,
``AIRFLOW_CONN_<ID>`` in JSON or URI form, then the metadata DB of the configured AIRFLOW_HOME, where
connections created in the UI live), so the same ``mysql_cdc_default`` a DAG uses works here, with
no api-server running and, for the first two, no Airflow database. The options the example DAG
takes from the environment default to the same variables here (``MYSQLCDC_STATE_ROOT``,
``MYSQLCDC_SINK_ROOT``, ``MYSQLCDC_STORAGE_CONN_ID``, ``MYSQLCDC_TABLES``), so on an Airflow
worker the CLI sees the pipelines the DAG runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3  # verify could not compare (the stream did not catch up, nothing captured)


def _backend_label(backend: Any, conn_id: str) -> str:
    """Where a secrets backend looks, in the words a user configures it with."""
    name = type(backend).__name__
    if name == "EnvironmentVariablesBackend":
        return f"environment variable AIRFLOW_CONN_{conn_id.upper()}"
    if name == "MetastoreBackend":
        from airflow.configuration import conf

        url = conf.get("database", "sql_alchemy_conn", fallback="")
        try:
            from sqlalchemy.engine import make_url

            url = make_url(url).render_as_string(hide_password=True)
        except Exception:  # shown as configured
            pass
        return f"metadata DB {url} (AIRFLOW_HOME={os.environ.get('AIRFLOW_HOME', '~/airflow')})"
    return f"secrets backend {type(backend).__module__}.{name}"


def _airflow_connection(conn_id: str) -> tuple[Any | None, list[str]]:
    """The connection (None if nowhere) and, per place searched, what was found there.

    Searched like ``airflow connections get``: the configured secrets backend, ``AIRFLOW_CONN_<ID>``,
    then the metadata DB of the configured AIRFLOW_HOME (connections created in the UI). The Task
    SDK's lookup (``BaseHook.get_connection``) skips the metadata DB outside a task, and the core
    model's ``get_connection_from_secrets`` logs a spurious RFC 3986 warning for ``mysql_cdc`` and
    swallows why a backend failed, so the same backends are walked here. No api-server is needed.
    """
    try:
        from airflow.configuration import ensure_secrets_loaded
    except ImportError:  # only the Task SDK is installed: environment variables and secrets backends
        from airflow.sdk import BaseHook

        try:
            return BaseHook.get_connection(conn_id), []
        except Exception as exc:
            if exc.__class__.__name__ != "AirflowNotFoundException":
                raise
            return None, ["environment and secrets backend (apache-airflow-core is not installed: no metadata DB)"]
    searched: list[str] = []
    for backend in ensure_secrets_loaded():
        where = _backend_label(backend, conn_id)
        try:
            conn = backend.get_connection(conn_id=conn_id)
        except Exception as exc:
            if exc.__class__.__name__ == "AirflowSecretsBackendAccessDenied":
                raise  # authoritative: Airflow does not fall through to the next backend either
            reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
            hint = ""
            if exc.__class__.__name__ == "InvalidToken":
                hint = "; it was saved with another Fernet key: set [core] fernet_key (AIRFLOW__CORE__FERNET_KEY) "
                hint += "to your Airflow's"
            elif type(backend).__name__ == "MetastoreBackend":
                hint = "; run `airflow db migrate`, or point AIRFLOW_HOME / AIRFLOW__DATABASE__SQL_ALCHEMY_CONN at "
                hint += "your Airflow's configuration"
            searched.append(f"{where}: could not be read ({exc.__class__.__name__}: {reason}{hint})")
            continue
        if conn:
            return conn, searched
        is_env = type(backend).__name__ == "EnvironmentVariablesBackend"
        searched.append(f"{where}: {'not set' if is_env else 'not there'}")
    return None, searched


def _settings(conn_id: str) -> Any:
    """The connection's :class:`ConnectionSettings`; a missing connection exits naming each place searched."""
    import contextlib

    from airflow_provider_mysqlcdc.hooks.mysql_cdc import settings_from_connection

    try:
        with contextlib.redirect_stdout(sys.stderr):  # Airflow logs to stdout; stdout is for results
            conn, searched = _airflow_connection(conn_id)
    except Exception as exc:  # an access-denying or broken secrets backend
        raise SystemExit(
            f"error: connection {conn_id!r} could not be read ({exc.__class__.__name__}: {exc}): check the "
            "secrets backend's settings ([secrets] backend / backend_kwargs) and its permissions"
        ) from None
    if conn is None:
        raise SystemExit(
            f"error: connection {conn_id!r} was not found where Airflow looks — " + "; ".join(searched)
            + ". Create it in the Airflow UI (Admin → Connections, type MySQL CDC), or with `airflow connections "
            f"add {conn_id} --conn-json '{{\"conn_type\":\"mysql_cdc\",\"host\":\"...\",\"port\":3306,"
            '"login":"...","password":"..."}\'`, or set AIRFLOW_CONN_'
            f"{conn_id.upper()} to that JSON; if it exists in your Airflow, run this with the same AIRFLOW_HOME "
            "(or AIRFLOW__DATABASE__SQL_ALCHEMY_CONN) as Airflow"
        )
    return settings_from_connection(conn)


def _tables(arg: str | None) -> list[str]:
    return [t.strip() for t in (arg or "").split(",") if t.strip()]


def _selection(args: argparse.Namespace) -> Any:
    from airflow_provider_mysqlcdc.core.table_selection import TableSelection

    try:
        return TableSelection.parse(_tables(args.tables), _tables(args.exclude_tables))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def cmd_check(args: argparse.Namespace) -> int:
    from airflow_provider_mysqlcdc.mysql.checks import SourceCheckError, check_source
    from airflow_provider_mysqlcdc.mysql.table_choice import choose_tables

    selection = _selection(args)
    settings = _settings(args.conn_id)
    notes: list[str] = []
    skipped_exact: list[str] = []  # a run captures the rest; a preflight says so by its exit code
    with settings.connect() as conn:
        if selection.include:
            try:
                choice = choose_tables(conn, selection, _chunk_keys(args.chunk_key))
                report, notes, skipped_exact = choice.report, choice.notes(), choice.skipped_exact
            except SourceCheckError as exc:
                report = exc.report
        else:
            report = check_source(conn, [], _chunk_keys(args.chunk_key))
    ok = report.ok and not skipped_exact
    if args.json:
        print(json.dumps({**report.to_dict(), "selection_notes": notes, "skipped_named_tables": skipped_exact},
                         indent=2))  # fmt: skip
    else:
        print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
        if skipped_exact:
            print(f"problem: {skipped_exact} cannot be captured and would be skipped (a run captures the other "
                  "tables); the notes say why and what to change", file=sys.stderr)  # fmt: skip
        for note in notes:
            print(f"  note: {note}", file=sys.stderr)
    return EXIT_OK if ok else EXIT_PROBLEMS


def _chunk_keys(items: list[str] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items or []:
        table, sep, cols = item.partition("=")
        if not sep or not cols:
            raise SystemExit(f"error: --chunk-key expects db.table=col[,col], got {item!r}")
        out[table.strip()] = [c.strip() for c in cols.split(",") if c.strip()]
    return out


def cmd_plan(args: argparse.Namespace) -> int:
    from airflow_provider_mysqlcdc.mysql.checks import SourceCheckError
    from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
    from airflow_provider_mysqlcdc.mysql.table_choice import choose_tables

    selection = _selection(args)
    if not selection.include:
        raise SystemExit("error: --tables (or MYSQLCDC_TABLES) is required, e.g. --tables shop.orders,shop.customers "
                         "or 'shop.*'")
    if args.chunk_size < 1:
        raise SystemExit(f"error: --chunk-size must be >= 1, got {args.chunk_size}")
    settings = _settings(args.conn_id)
    chunk_keys = _chunk_keys(args.chunk_key)
    with settings.connect() as conn:
        try:
            choice = choose_tables(conn, selection, chunk_keys)
        except SourceCheckError as exc:
            print(exc.report.summary(), file=sys.stderr)
            return EXIT_PROBLEMS
        report, tables = choice.report, choice.tables
        for note in choice.notes():
            print(f"note: {note}", file=sys.stderr)
        if report.warnings:  # stdout is the plan's JSON
            print(report.warnings_summary(), file=sys.stderr)
        plan = plan_snapshot(conn, tables, args.chunk_size, args.chunks_per_group, chunk_keys)
    out = []
    for g in plan.groups:
        for s in g.splits:
            d = s.to_dict()
            d["group_id"] = g.group_id
            out.append(d)
    print(json.dumps(out, indent=None if args.compact else 2))
    print(
        f"planned {len(plan.splits)} chunks of {len(plan.tables)} table(s) in {len(plan.groups)} group(s) "
        f"({', '.join(f'{t}: {m}' for t, m in plan.methods.items())})",
        file=sys.stderr,
    )
    return EXIT_OK


def _state_store(args: argparse.Namespace) -> Any:
    from airflow_provider_mysqlcdc.hooks.object_storage import lake_storage
    from airflow_provider_mysqlcdc.state import StateStore

    return StateStore(args.state_root, args.pipeline, lake_storage(args.storage_conn_id))


def _require_pipeline(store: Any) -> None:
    """Exit 1 naming what the state root holds when it has nothing of ``store``'s pipeline."""
    from airflow_provider_mysqlcdc.state import unknown_pipeline_problem

    problem = unknown_pipeline_problem(store)
    if problem:
        raise SystemExit(f"error: {problem} (--pipeline, and --state-root or MYSQLCDC_STATE_ROOT)")


def cmd_status(args: argparse.Namespace) -> int:
    from airflow_provider_mysqlcdc.stream.control import pipeline_status

    store = _state_store(args)
    _require_pipeline(store)
    server_offset, problem = None, None
    try:
        with _settings(args.conn_id).connect() as conn:
            from airflow_provider_mysqlcdc.mysql.server import current_offset

            server_offset = current_offset(conn)
    except (SystemExit, Exception) as exc:  # status must work while the source is down
        problem = str(exc).removeprefix("error: ")
    out = pipeline_status(store, server_offset)
    if problem:
        out["server_offset_error"] = problem
    print(json.dumps(out, indent=None if args.compact else 2, default=str))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from airflow_provider_mysqlcdc.stream.control import request_stop

    store = _state_store(args)
    _require_pipeline(store)
    out = request_stop(store, timeout=args.timeout)
    print(json.dumps(out, indent=2, default=str))
    print(
        f"stream of {args.pipeline}: " + ("stopped" if out["stopped"] else "was not running")
        + f" (committed offset {out['committed_offset']})",
        file=sys.stderr,
    )
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """Compare the lake with the source chunk by chunk; exit 1 when a chunk differs."""
    from airflow_provider_mysqlcdc.hooks.object_storage import lake_storage
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.verify import VerifyError, verify_pipeline

    store = _state_store(args)
    sink = DeltaSink(args.sink_root, lake_storage(args.storage_conn_id))
    try:
        report = verify_pipeline(_settings(args.conn_id), store, sink, _tables(args.tables) or None,
                                 wait_timeout=args.wait_timeout,
                                 progress=lambda m: print(m, file=sys.stderr))  # fmt: skip
    except VerifyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
        print(report.summary(), file=sys.stderr)
    else:
        print(report.summary())
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def cmd_job_secrets(args: argparse.Namespace) -> int:
    """The environment a Spark job of this provider needs, for a cluster's secret store (Kubernetes)."""
    from airflow_provider_mysqlcdc.hooks.object_storage import lake_storage
    from airflow_provider_mysqlcdc.hooks.spark_submit import secret_env

    print(json.dumps(secret_env(_settings(args.conn_id), lake_storage(args.storage_conn_id)), indent=2))
    print("these values are secrets: put them in a secret store, never in a DAG or a Spark conf", file=sys.stderr)
    return EXIT_OK


def _env(name: str) -> str | None:
    """An option's default from the environment variable the example DAG reads (set but empty = unset)."""
    return os.environ.get(name) or None


def build_parser() -> argparse.ArgumentParser:
    from airflow_provider_mysqlcdc.core.chunk import DEFAULT_CHUNK_SIZE
    from airflow_provider_mysqlcdc.mysql.planner import DEFAULT_CHUNKS_PER_GROUP

    p = argparse.ArgumentParser(prog="mysqlcdc", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log what is happening")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--conn-id", default="mysql_cdc_default", help="Airflow connection id (mysql_cdc type)")
        sp.add_argument("--tables", default=_env("MYSQLCDC_TABLES"),
                        help="comma-separated <database>.<table> names or patterns ('shop.*', 'shop\\.order_[0-9]+'; "
                        "docs/architecture.md, \"Table selection\"); default $MYSQLCDC_TABLES, as the DAG")
        sp.add_argument("--exclude-tables", help="comma-separated names or patterns to leave out")
        sp.add_argument(
            "--chunk-key", action="append", metavar="DB.TABLE=COL[,COL]",
            help="chunk key columns for a table (default: its primary key); repeatable",
        )

    c = sub.add_parser(
        "check",
        help="check binlog settings, privileges and tables; exit 1 on any problem (warnings, e.g. cascading "
        "foreign keys, are printed but do not change the exit code)",
    )
    common(c)
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.set_defaults(func=cmd_check)

    pl = sub.add_parser("plan", help="split tables into chunks and print them as JSON")
    common(pl)
    pl.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    pl.add_argument("--chunks-per-group", type=int, default=DEFAULT_CHUNKS_PER_GROUP)
    pl.add_argument("--compact", action="store_true", help="one-line JSON")
    pl.set_defaults(func=cmd_plan)

    def pipeline_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--pipeline", required=True, help="pipeline id (the DAG's pipeline_id param)")
        state_root = _env("MYSQLCDC_STATE_ROOT")
        sp.add_argument("--state-root", default=state_root, required=state_root is None,
                        help="the pipeline's state store (directory or URL); default $MYSQLCDC_STATE_ROOT, as the DAG")
        sp.add_argument("--storage-conn-id", default=_env("MYSQLCDC_STORAGE_CONN_ID"),
                        help="Airflow connection with the object-store credentials of --state-root (e.g. aws_default); "
                        "default $MYSQLCDC_STORAGE_CONN_ID, as the DAG")

    st = sub.add_parser("status", help="the stream's state, offsets and lag, and each table's phase, as JSON")
    pipeline_args(st)
    st.add_argument("--conn-id", default="mysql_cdc_default", help="source connection, for the server's offset")
    st.add_argument("--compact", action="store_true", help="one-line JSON")
    st.set_defaults(func=cmd_status)

    js = sub.add_parser(
        "job-secrets",
        help="print the environment variables (JSON) a Spark job needs: the source connection and storage keys, "
        "for a Kubernetes secret in cluster deploy mode",
    )
    js.add_argument("--conn-id", default="mysql_cdc_default", help="source connection (mysql_cdc type)")
    js.add_argument("--storage-conn-id", default=_env("MYSQLCDC_STORAGE_CONN_ID"),
                    help="connection with the lake's object-store credentials; default $MYSQLCDC_STORAGE_CONN_ID")
    js.set_defaults(func=cmd_job_secrets)

    vf = sub.add_parser(
        "verify",
        help="compare source and lake chunk by chunk (row count and a digest of every value, computed by the "
        "server and on the Delta table at one consistent point, while the stream runs); exit 1 on a difference",
    )
    pipeline_args(vf)
    sink_root = _env("MYSQLCDC_SINK_ROOT")
    vf.add_argument("--sink-root", default=sink_root, required=sink_root is None,
                    help="where the Delta tables are (the DAG's sink_root); default $MYSQLCDC_SINK_ROOT, as the DAG")
    vf.add_argument("--conn-id", default="mysql_cdc_default", help="source connection (mysql_cdc type)")
    vf.add_argument("--tables", help="comma-separated captured tables to check (default: all, as the DAG's verify)")
    vf.add_argument("--wait-timeout", type=float, default=600.0,
                    help="seconds to wait for the stream to reach the source's position")
    vf.add_argument("--json", action="store_true", help="print the report as JSON (the table goes to stderr)")
    vf.set_defaults(func=cmd_verify)

    sp = sub.add_parser("stop", help="stop the pipeline's stream after its running micro-batch")
    pipeline_args(sp)
    sp.add_argument("--timeout", type=float, default=300.0, help="seconds before a hard stop (same host only)")
    sp.set_defaults(func=cmd_stop)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Importing Airflow configures logging to stdout; stdout is for results (JSON), logs go to stderr.
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        import airflow_provider_mysqlcdc.hooks.mysql_cdc  # noqa: F401

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.root.handlers = [handler]
    logging.root.setLevel(logging.INFO if args.verbose else logging.WARNING)
    from airflow_provider_mysqlcdc.core.table import SourceSchemaError
    from airflow_provider_mysqlcdc.mysql.connection import SourceConnectionError

    try:
        return int(args.func(args))
    except (SourceConnectionError, SourceSchemaError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS


if __name__ == "__main__":
    sys.exit(main())
