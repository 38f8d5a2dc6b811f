#!/usr/bin/env bash
# Builds, when missing, the Debian roots holding the servers the tests run beside the machine's own
# MariaDB 10.11 (issue 34): MySQL 9.7 (suite sid) and MariaDB 11.8 (suite trixie). Their packages need
# a newer libc than the machine's, so each lives in its own root, built by mmdebstrap from the mirror
# of the machine's apt sources and run with chroot (tests/support/servers.py).
#   roots dir: $MYSQLCDC_SERVER_ROOTS, default /var/cache/mysqlcdc/roots (outside the repo: a fresh
#   clone on the same machine reuses them). A root is built in <name>.tmp and renamed once complete
#   (with a .mysqlcdc-root-complete stamp), so an interrupted build never looks finished.
# Output: one line per step; the full log goes to .bootstrap.log (its tail is shown on a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
LOG="$PWD/.bootstrap.log"
ROOTS="${MYSQLCDC_SERVER_ROOTS:-/var/cache/mysqlcdc/roots}"
STAMP=.mysqlcdc-root-complete
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

fail() {
  echo "server-roots: FAILED: $*" >&2
  echo "---- last lines of $LOG ----" >&2
  tail -n 40 "$LOG" >&2
  echo "server-roots: fix the cause above, then run: make server-roots" >&2
  exit 1
}

run_logged() {  # run a step quietly; show the log's tail if it fails
  echo "+ $*" >>"$LOG"
  "$@" >>"$LOG" 2>&1 || fail "$*"
}

mirror() {  # the Debian mirror of the machine's apt sources (never written into the repo)
  local uri=""
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' /etc/apt/sources.list.d/*.sources \
      | grep -v -- '-security' | head -n1 || true)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' \
      /etc/apt/sources.list | grep -v -- '-security' | head -n1 || true)
  fi
  [ -n "$uri" ] || { echo "server-roots: no Debian mirror found in /etc/apt/sources.list(.d)" >&2; exit 1; }
  echo "$uri"
}

# name suite packages version-command (run inside the root)
ROOT_SPECS=(
  "mysql97|sid|mysql-server-core,mysql-client-core|mysqld --version"
  "mariadb118|trixie|mariadb-server,mariadb-client|mariadbd --version"
)

build_root() {
  local name=$1 suite=$2 packages=$3 dir="$ROOTS/$1" t0
  local tmp="$dir.tmp"
  echo "server-roots: building $name ($suite: $packages) in $dir (about a minute; log: .bootstrap.log)"
  t0=$(date +%s)
  run_logged $SUDO rm -rf "$tmp"
  run_logged $SUDO mmdebstrap --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' \
    --include="$packages" "$suite" "$tmp" "$(mirror)"
  run_logged $SUDO cp /etc/hosts "$tmp/etc/hosts"
  run_logged $SUDO sh -c "date -u +%Y-%m-%dT%H:%M:%SZ > '$tmp/$STAMP'"
  run_logged $SUDO rm -rf "$dir"
  run_logged $SUDO mv "$tmp" "$dir"
  echo "server-roots: $name built in $(( $(date +%s) - t0 ))s"
}

missing=0
for spec in "${ROOT_SPECS[@]}"; do
  IFS='|' read -r name _ _ _ <<<"$spec"
  [ -f "$ROOTS/$name/$STAMP" ] || missing=1
done

if [ "$missing" = 1 ]; then
  run_logged $SUDO mkdir -p "$ROOTS"
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    echo "server-roots: installing Debian package mmdebstrap (log: .bootstrap.log)"
    run_logged $SUDO apt-get update -q
    run_logged env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends mmdebstrap
  fi
fi

for spec in "${ROOT_SPECS[@]}"; do
  IFS='|' read -r name suite packages version_cmd <<<"$spec"
  [ -f "$ROOTS/$name/$STAMP" ] || build_root "$name" "$suite" "$packages"
  # shellcheck disable=SC2086  # version_cmd is a command and its argument
  version=$($SUDO chroot "$ROOTS/$name" $version_cmd 2>>"$LOG") || fail "chroot $ROOTS/$name $version_cmd"
  echo "server-roots: $name ready: $version"
done
