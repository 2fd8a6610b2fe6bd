#!/usr/bin/env bash
# tests/peers/ironic.sh: the real OpenStack Ironic 39.0.0 (PyPI) that the workflow service's
# integration test drives (services/workflow/tests/it/ironic_real.rs); like slurm.sh and prometheus.sh, for
# tests/run to call (`start`) before cargo test. One all-in-one `ironic` process (API + conductor),
# bound to 127.0.0.1:
#   ironic  http://127.0.0.1:6385/v1, auth_strategy=noauth, SQLite ($DIR/ironic.sqlite),
#           rpc_transport=none (no RabbitMQ, no JSON-RPC port), only the fake-hardware hardware
#           type with fake interfaces (deploy, boot, power, management, ...), network/storage noop,
#           [conductor] automated_clean=false (undeploy: active -> deleting -> cleaning -> available);
#           [fake] vendor_delay=5: a node made with "automated_clean": true cleans for 5 s.
# Usage: tests/peers/ironic.sh [start|stop|status]   (default start)
#   start: idempotent: says so and exits 0 when already running and healthy; otherwise a fresh
#          start that wipes $DIR (config, SQLite DB, log): no nodes.
# Env: PEERS_DIR (/tmp/peers), IRONIC_PORT (6385), IRONIC_VENV (/opt/peers/ironic); $DIR=$PEERS_DIR/ironic
# Client: every request needs the header  X-OpenStack-Ironic-API-Version: 1.115  (or "latest");
#         without it the API answers as microversion 1.1 and hides most fields (lessee, owner, ...).
#   curl -H 'X-OpenStack-Ironic-API-Version: 1.115' http://127.0.0.1:6385/v1/nodes
# The first start creates the venv $IRONIC_VENV with Debian's python3 and pip-installs
# ironic==39.0.0 from PyPI into it (about 30 s, ~320 MB); missing Debian packages (python3-venv, ...)
# come from apt-get. Nothing else is downloaded. Errors: "ERROR: ..." and exit 1.
set -euo pipefail
ME=tests/peers/ironic.sh
PEERS_DIR=${PEERS_DIR:-/tmp/peers}
DIR=$PEERS_DIR/ironic
VENV=${IRONIC_VENV:-/opt/peers/ironic}
PORT=${IRONIC_PORT:-6385}
IRONIC_VERSION=39.0.0
PYTHON=/usr/bin/python3   # Debian's, not whatever python3 is first on PATH (pyenv, ...)
CONF=$DIR/ironic.conf
PIDFILE=$DIR/ironic.pid
LOG=$DIR/ironic.log
PIPLOG=$PEERS_DIR/ironic-pip.log   # outside $DIR: a fresh start wipes $DIR
URL=http://127.0.0.1:$PORT
HDR='X-OpenStack-Ironic-API-Version: 1.115'

die() {
  echo "$ME: ERROR: $*" >&2
  if [ -n "${STARTED:-}" ]; then grep -E 'ERROR|CRITICAL|Error' "$LOG" 2>/dev/null | tail -n 10 >&2 || true; fi
  exit 1
}
# What the peer scripts share: say, alive, port_busy, apt_install.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
running() { alive "$PIDFILE" "bin/ironic --config-file"; }
# Ready = the API answers AND the conductor has registered the fake-hardware driver.
ready() { curl -fsS -m 5 -H "$HDR" "$URL/v1/drivers" 2>/dev/null | grep -q '"fake-hardware"'; }
healthy() { running && ready; }
venv_version() { "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("ironic"))' 2>/dev/null; }

# The process was started with setsid: it leads its own process group, which holds it and the
# workers oslo.service forks. SIGTERM the group, up to 10 s, then SIGKILL what is left. A group
# whose master died (kill -9) but whose worker still runs is cleaned up the same way.
group_alive() { ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { f = 1 } END { exit !f }'; }
stop() {
  local pid=""
  [ -s "$PIDFILE" ] && pid=$(cat "$PIDFILE" 2>/dev/null)
  if [[ $pid =~ ^[0-9]+$ ]] && { running || pgrep -g "$pid" -f ironic >/dev/null 2>&1; }; then
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do group_alive "$pid" || break; sleep 0.1; done
    if group_alive "$pid"; then kill -KILL -- "-$pid" 2>/dev/null || true; sleep 0.2; fi
  fi
  rm -f "$PIDFILE"
}

case "${1:-start}" in
  stop) stop; say "stopped"; exit 0 ;;
  status) if healthy; then say "running on $URL/v1 (pid $(cat "$PIDFILE"))"; exit 0; fi
          say "not running"; exit 1 ;;
  start) ;;
  *) die "unknown command '$1' (start|stop|status)" ;;
esac
[[ "$PORT" =~ ^[0-9]+$ ]] || die "IRONIC_PORT must be a port number"

if healthy; then
  say "already running on $URL/v1 (ironic $(venv_version), pid $(cat "$PIDFILE"))"; exit 0
fi

# Debian 12 packages: python3 with venv/ensurepip (python3-venv), curl, setsid.
missing=""
{ [ -x "$PYTHON" ] && "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; } || missing="$missing python3 python3-venv"
command -v curl >/dev/null || missing="$missing curl"
command -v setsid >/dev/null || missing="$missing util-linux"
command -v pgrep >/dev/null || missing="$missing procps"
# shellcheck disable=SC2086
[ -z "$missing" ] || apt_install $missing
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || die "$PYTHON has no venv/ensurepip module"
for c in curl setsid pgrep ps; do command -v "$c" >/dev/null || die "$c not found"; done

# The venv: (re)install when ironic is missing or not $IRONIC_VERSION (an interrupted install too).
if [ ! -x "$VENV/bin/ironic" ] || [ ! -x "$VENV/bin/ironic-dbsync" ] || [ "$(venv_version)" != "$IRONIC_VERSION" ]; then
  say "installing ironic==$IRONIC_VERSION from PyPI into $VENV (about 30 s the first time) ..."
  mkdir -p "$PEERS_DIR" "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" >"$PIPLOG" 2>&1 \
    || { tail -n 20 "$PIPLOG" >&2; die "$PYTHON -m venv $VENV failed"; }
  "$VENV/bin/python" -m pip install -q --upgrade pip >>"$PIPLOG" 2>&1 || true
  "$VENV/bin/python" -m pip install -q "ironic==$IRONIC_VERSION" >>"$PIPLOG" 2>&1 \
    || { tail -n 20 "$PIPLOG" >&2; die "pip install ironic==$IRONIC_VERSION failed (log: $PIPLOG)"; }
  [ "$(venv_version)" = "$IRONIC_VERSION" ] && [ -x "$VENV/bin/ironic" ] \
    || die "ironic $IRONIC_VERSION is not in $VENV after pip install (log: $PIPLOG)"
fi

stop
port_busy "$PORT" && die "port 127.0.0.1:$PORT already in use (another ironic?)"

# Fresh config + DB.
T0=$(date +%s.%N)
rm -rf "$DIR"; mkdir -p "$DIR/locks" "$DIR/tmp"
cat >"$CONF" <<EOF
[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = peers-ironic
tempdir = $DIR/tmp
enabled_hardware_types = fake-hardware
enabled_bios_interfaces = fake,no-bios
enabled_boot_interfaces = fake
enabled_console_interfaces = fake,no-console
enabled_deploy_interfaces = fake
enabled_firmware_interfaces = fake,no-firmware
enabled_inspect_interfaces = fake,no-inspect
enabled_management_interfaces = fake
enabled_network_interfaces = noop
enabled_power_interfaces = fake
enabled_raid_interfaces = fake,no-raid
enabled_rescue_interfaces = fake,no-rescue
enabled_storage_interfaces = noop
enabled_vendor_interfaces = fake,no-vendor
default_deploy_interface = fake
default_network_interface = noop
use_stderr = true
debug = false

[api]
host_ip = 127.0.0.1
port = $PORT

[database]
connection = sqlite:///$DIR/ironic.sqlite

[dhcp]
dhcp_provider = none

[conductor]
automated_clean = false

# A node created with "automated_clean": true cleans for 5 s on teardown
# (deleting -> cleaning -> available), long enough for a test to see a node
# already tearing down; every other node cleans at once.
[fake]
vendor_delay = 5

[nova]
send_power_notifications = false

[oslo_concurrency]
lock_path = $DIR/locks
EOF
"$VENV/bin/ironic-dbsync" --config-file "$CONF" create_schema >"$DIR/dbsync.log" 2>&1 \
  || { tail -n 20 "$DIR/dbsync.log" >&2; die "ironic-dbsync create_schema failed (log: $DIR/dbsync.log)"; }
# Write-ahead logging (kept in the file): readers no longer block the writer, so
# tests running in parallel do not meet SQLite's "database is locked".
"$VENV/bin/python" -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute("PRAGMA journal_mode=WAL").fetchone()' \
  "$DIR/ironic.sqlite" || die "could not switch $DIR/ironic.sqlite to WAL"

# Start in its own session (a Ctrl-C of tests/run leaves it), stdin closed, cwd $DIR; the pid of
# ironic itself goes to $PIDFILE.
cd "$DIR"
setsid sh -c 'echo $$ >"$0"; exec "$@"' "$PIDFILE" \
  "$VENV/bin/ironic" --config-file "$CONF" </dev/null >"$LOG" 2>&1 &
for _ in $(seq 1 50); do [ -s "$PIDFILE" ] && break; sleep 0.05; done
[ -s "$PIDFILE" ] || die "could not start $VENV/bin/ironic"
STARTED=1
for _ in $(seq 1 240); do
  ready && break
  running || die "ironic exited during startup (log: $LOG)"
  sleep 0.25
done
ready || die "ironic is not serving $URL/v1/drivers with fake-hardware after 60 s (log: $LOG)"
MAXV=$(curl -fsS -m 5 "$URL/" | sed -n 's/.*"version": *"\([0-9.]*\)".*/\1/p' | head -n 1)
ELAPSED=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
say "ready: $URL/v1 (ironic $(venv_version), API max microversion $MAXV, pid $(cat "$PIDFILE")) in ${ELAPSED}s"
