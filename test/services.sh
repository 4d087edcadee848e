#!/usr/bin/env bash
# bash test/services.sh [--test-tools]
#
# Ensures the services imshard runs on are up: MariaDB and Redis, installing them
# with apt-get where missing (fresh Debian). This is all `make run` needs.
# Idempotent: running services are only reported. Only the default local
# addresses are ever started.
#
# --test-tools (test/run.sh) also installs what only the tests use: promtool
# (package prometheus; the alert rules' tests), systemd-analyze (package
# systemd; checks the shipped units — where it cannot be installed the unit test
# says so when it skips) and the OpenAPI linter (Redocly CLI from the npm
# registry, pinned by test/tools/openapi-lint; needs Node.js 20.19+ and npm).
#
#   IMSHARD_TEST_MYSQL_ADDR  default 127.0.0.1:3306
#   IMSHARD_TEST_REDIS_ADDR  default 127.0.0.1:6379
#
# A service that cannot be brought up is an error (exit 1), never a skip.
set -euo pipefail

MYSQL_ADDR="${IMSHARD_TEST_MYSQL_ADDR:-127.0.0.1:3306}"
REDIS_ADDR="${IMSHARD_TEST_REDIS_ADDR:-127.0.0.1:6379}"
MYSQL_HOST="${MYSQL_ADDR%:*}" MYSQL_PORT="${MYSQL_ADDR##*:}"
REDIS_HOST="${REDIS_ADDR%:*}" REDIS_PORT="${REDIS_ADDR##*:}"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

say() { echo "services: $*"; }
die() { echo "services: ERROR: $*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

SUDO=()
if [ "$(id -u)" -ne 0 ] && have sudo; then SUDO=(sudo); fi
as_root() { "${SUDO[@]}" "$@"; }

APT_UPDATED=0
apt_install() {
  have apt-get || die "$* must be installed but apt-get is not available; install it by hand"
  if [ "$APT_UPDATED" = 0 ]; then
    as_root apt-get update -qq || die "apt-get update failed"
    APT_UPDATED=1
  fi
  say "installing $* with apt-get"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
    || die "apt-get install $* failed"
}

tcp_open() { timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

# ---------------------------------------------------------------- MariaDB ---
mariadbd_bin() { if [ -x /usr/sbin/mariadbd ]; then echo /usr/sbin/mariadbd; else command -v mariadbd || true; fi; }
mysql_admin() { command -v mariadb-admin || command -v mysqladmin || true; }
mysql_client() { command -v mariadb || command -v mysql || true; }

mysql_alive() { # the server answers (even "access denied" counts)
  local admin; admin="$(mysql_admin)"
  if [ -n "$admin" ]; then
    "$admin" ping -h"$MYSQL_HOST" -P"$MYSQL_PORT" --protocol=tcp --connect-timeout=3 >/dev/null 2>&1
  else
    tcp_open "$MYSQL_HOST" "$MYSQL_PORT"
  fi
}

root_tcp_ok() { # root with an empty password over TCP
  "$(mysql_client)" -h"$MYSQL_HOST" -P"$MYSQL_PORT" --protocol=tcp --connect-timeout=3 \
    -uroot --password= -e 'SELECT 1' >/dev/null 2>&1
}

start_mariadb() {
  local bin datadir log
  bin="$(mariadbd_bin)"
  [ -d /run/mysqld ] || as_root install -d -o mysql -g mysql -m 0755 /run/mysqld
  datadir="$(as_root "$bin" --user=mysql --verbose --help 2>/dev/null | awk '$1=="datadir"{print $2}')"
  datadir="${datadir:-/var/lib/mysql/}"
  if ! as_root test -d "$datadir/mysql"; then # package installed without initialising its datadir
    say "mariadb: initialising $datadir"
    as_root mariadb-install-db --user=mysql --datadir="$datadir" >/dev/null || die "mariadb-install-db failed"
  fi
  as_root start-stop-daemon --start --oknodo --background --exec "$bin" -- --user=mysql \
    || die "start-stop-daemon could not start $bin"
  for _ in $(seq 60); do
    mysql_alive && return 0
    sleep 1
  done
  log="$(as_root "$bin" --user=mysql --verbose --help 2>/dev/null | awk '$1=="log-error"{print $2}')"
  [ -n "$log" ] && as_root tail -n 20 "$log" >&2 2>/dev/null || true
  die "mariadbd started but $MYSQL_ADDR does not answer after 60 s${log:+ (log: $log)}"
}

fix_root_login() { # fresh Debian: root@localhost uses unix_socket only
  as_root "$(mysql_client)" -uroot --protocol=socket -e "
    ALTER USER root@localhost IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
    CREATE USER IF NOT EXISTS root@'127.0.0.1';
    ALTER USER root@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
    GRANT ALL PRIVILEGES ON *.* TO root@'127.0.0.1' WITH GRANT OPTION;
    FLUSH PRIVILEGES;" \
    || die "root cannot log in to $MYSQL_ADDR over TCP with an empty password, and fixing that through the unix socket failed"
}

ensure_mysql() {
  local default=0 did
  [ "$MYSQL_ADDR" = 127.0.0.1:3306 ] && default=1
  # Private instances for fault tests need mariadbd and mariadb-install-db.
  if [ -z "$(mariadbd_bin)" ] || ! have mariadb-install-db || { [ "$default" = 1 ] && [ -z "$(mysql_client)" ]; }; then
    apt_install mariadb-server mariadb-client
  fi
  [ -n "$(mariadbd_bin)" ] && have mariadb-install-db || die "mariadbd / mariadb-install-db still missing after installing mariadb-server"
  # The restore drill dumps and loads a tenant database with the client tools.
  if [ -z "$(mysql_client)" ] || ! { have mariadb-dump || have mysqldump; }; then
    apt_install mariadb-client
  fi

  if mysql_alive; then
    did="already running at $MYSQL_ADDR"
  elif [ "$default" = 0 ]; then
    die "MariaDB/MySQL at $MYSQL_ADDR (IMSHARD_TEST_MYSQL_ADDR) does not answer; this script only starts the default 127.0.0.1:3306"
  else
    start_mariadb
    did="started mariadbd at $MYSQL_ADDR"
  fi

  if [ -z "$(mysql_client)" ]; then
    did="$did; root login not checked (no mariadb client)"
  elif root_tcp_ok; then
    did="$did; root over TCP ok"
  elif [ "$default" = 1 ]; then
    fix_root_login
    root_tcp_ok || die "root still cannot log in to $MYSQL_ADDR over TCP with an empty password"
    did="$did; enabled root over TCP with an empty password"
  else
    did="$did; root with an empty password refused (set IMSHARD_TEST_MYSQL_DSN with credentials)"
  fi
  say "mariadb: $did"
}

# ------------------------------------------------------------------ Redis ---
redis_alive() {
  if have redis-cli; then
    [ "$(timeout 5 redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
  else
    timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "PING\r\n" >&3 && read -r l <&3 && case "$l" in +PONG*) ;; *) exit 1 ;; esac' \
      _ "$REDIS_HOST" "$REDIS_PORT" 2>/dev/null
  fi
}

ensure_redis() {
  local did log
  have redis-server || apt_install redis-server # the fault tests start private instances
  have redis-server || die "redis-server still missing after installing it"

  if redis_alive; then
    did="already running at $REDIS_ADDR"
  elif [ "$REDIS_ADDR" != 127.0.0.1:6379 ]; then
    die "Redis at $REDIS_ADDR (IMSHARD_TEST_REDIS_ADDR) does not answer PING; this script only starts the default 127.0.0.1:6379"
  else
    log="${TMPDIR:-/tmp}/imshard-redis-$(id -u).log"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir "${TMPDIR:-/tmp}" --logfile "$log" || die "redis-server failed to start (log: $log)"
    for _ in $(seq 30); do
      redis_alive && break
      sleep 1
    done
    redis_alive || { tail -n 20 "$log" >&2 || true; die "redis-server started but $REDIS_ADDR does not answer PING after 30 s (log: $log)"; }
    did="started redis-server at $REDIS_ADDR (log: $log)"
  fi
  say "redis: $did"
}

# ------------------------------------------------------- systemd-analyze ---
ensure_systemd_analyze() {
  have systemd-analyze && return 0
  # A subshell: apt_install dies on failure, which here only means the units
  # go unchecked (the test reports it), not that the suite cannot run.
  if (apt_install systemd) && have systemd-analyze; then
    say "systemd-analyze: installed"
  else
    say "WARNING: systemd-analyze could not be installed; the docs/systemd units will not be verified"
  fi
}

# --------------------------------------------------------------- promtool ---
# The alert rules and their unit tests (docs/alerts.yml, docs/alerts_test.yml) are checked
# with promtool from Debian's prometheus package. The package would start a Prometheus
# server on :9090 (imshard's metrics port): a policy-rc.d that refuses service starts is put
# in place for the install when none exists.
ensure_promtool() {
  local policy=/usr/sbin/policy-rc.d
  if ! have promtool; then
    if ! as_root test -e "$policy"; then
      printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
      as_root chmod 755 "$policy"
      trap 'as_root rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt_install prometheus
  fi
  have promtool || die "promtool still missing after installing prometheus"
  say "promtool: $(promtool --version 2>&1 | head -n 1)"
}

# ----------------------------------------------------------- openapi-lint ---
# Redocly CLI lints docs/openapi.yaml (test/run.sh). Node.js and npm come from
# Debian where missing (Debian 13's are recent enough; 12's Node.js 18 is not,
# and lint.sh says so); the pinned CLI is installed once into a cache.
ensure_openapi_lint() {
  have node && have npm || apt_install nodejs npm
  bash "$(dirname "${BASH_SOURCE[0]}")/tools/openapi-lint/lint.sh" --install
  say "openapi-lint: Redocly CLI installed, node $(node --version)"
}

case "${1:-}" in
  "") test_tools=0 ;;
  --test-tools) test_tools=1 ;;
  *) die "unknown argument $1 (usage: bash test/services.sh [--test-tools])" ;;
esac
ensure_mysql
ensure_redis
if [ "$test_tools" = 1 ]; then
  ensure_systemd_analyze
  ensure_promtool
  ensure_openapi_lint
fi
