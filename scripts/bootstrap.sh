#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine, idempotently:
#   - Debian packages: mariadb-server (mariadbd, mariadb-install-db), libmariadb-java (JDBC jar
#     for Spark), a JRE if none is present;
#   - a virtualenv at .venv with the provider installed (editable) at the tested versions;
#   - the Debian roots the tests run MySQL 9.7 and MariaDB 11.8 from (scripts/server_roots.sh),
#     when one is missing.
# Re-running is cheap: the pip step is skipped while setup.cfg and constraints.txt are unchanged.
# Output goes to .bootstrap.log (one line here per step); on a failure its last lines are shown.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG="$PWD/.bootstrap.log"

run_logged() {  # run a step quietly; show the log's tail if it fails
  if ! "$@" >>"$LOG" 2>&1; then
    echo "bootstrap: FAILED: $*" >&2
    echo "---- last lines of $LOG ----" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}

need_apt=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || need_apt+=(mariadb-client)
[ -f /usr/share/java/mariadb-java-client.jar ] || need_apt+=(libmariadb-java)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages ${need_apt[*]} (about a minute; log: .bootstrap.log)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  run_logged $SUDO apt-get update -q
  run_logged env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  run_logged "$PY" -m venv .venv
fi
stamp=.venv/.mysqlcdc-installed
want=$(cat setup.cfg constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing Python packages into .venv (first run: 3-6 minutes; log: .bootstrap.log)"
  t0=$(date +%s)
  run_logged .venv/bin/python -m pip install -q -U pip setuptools wheel
  run_logged .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
  # pyspark-client (pulled by the Spark provider) shares pyspark's directory; make sure the
  # pyspark distribution's own files win (see README "Install into an existing Airflow").
  run_logged .venv/bin/python -m pip install -q -c constraints.txt --no-deps --force-reinstall pyspark
  echo "$want" > "$stamp"
  echo "bootstrap: Python packages installed in $(( $(date +%s) - t0 ))s"
fi

ROOTS="${MYSQLCDC_SERVER_ROOTS:-/var/cache/mysqlcdc/roots}"
for name in mysql97 mariadb118; do
  if [ ! -f "$ROOTS/$name/.mysqlcdc-root-complete" ]; then
    bash scripts/server_roots.sh
    break
  fi
done
