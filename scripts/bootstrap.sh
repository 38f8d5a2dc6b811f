#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine, idempotently:
#   - Debian packages: mariadb-server (mariadbd, mariadb-install-db), libmariadb-java (JDBC jar
#     for Spark), a JRE if none is present;
#   - a virtualenv at .venv with the provider installed (editable) at the tested versions.
# Re-running is cheap: the pip step is skipped while setup.cfg and constraints.txt are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || need_apt+=(mariadb-client)
[ -f /usr/share/java/mariadb-java-client.jar ] || need_apt+=(libmariadb-java)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.mysqlcdc-installed
want=$(cat setup.cfg constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing Python packages into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install -q -U pip setuptools wheel
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
  # pyspark-client (pulled by the Spark provider) shares pyspark's directory; make sure the
  # pyspark distribution's own files win (DESIGN §5).
  .venv/bin/python -m pip install -q -c constraints.txt --no-deps --force-reinstall pyspark
  echo "$want" > "$stamp"
fi
