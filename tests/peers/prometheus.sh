#!/usr/bin/env bash
# tests/peers/prometheus.sh: the real Prometheus 2.42 (Debian 12 package) that connector-health's
# integration test reads (services/connector-health/tests/it/health_real.rs). tests/run calls it (`start`) before
# cargo test. Everything binds to 127.0.0.1:
#   prometheus 127.0.0.1:9090, scraping the textfile below every 1 s (job gpu-textfile, honor_labels);
#              also --web.enable-remote-write-receiver (POST /api/v1/write), --web.enable-admin-api,
#              --web.enable-lifecycle (POST /-/reload)
#   textfile   $DIR/textfile/metrics, served by `python3 -m http.server` on 127.0.0.1:9101/metrics
#              (rewrite it to change values; the next scrape picks them up). Known series:
#              DCGM_FI_DEV_GPU_TEMP{Hostname,gpu,modelName} and DCGM_FI_DEV_XID_ERRORS{Hostname,gpu}
#              for gpu01..gpu04 x 8 GPUs (gpu02/gpu 3 has XID 79), node_up{instance} (gpu03 = 0).
# Usage: tests/peers/prometheus.sh [start|stop|status]   (default start)
#   start: idempotent: says so and exits 0 when already running and healthy; otherwise a fresh
#          start that wipes $DIR (TSDB and textfile).
# Env: PEERS_DIR (/tmp/peers), PROM_PORT (9090), PROM_TEXTFILE_PORT (9101); $DIR=$PEERS_DIR/prometheus
# Query: curl 'http://127.0.0.1:9090/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP'
# Installs missing Debian packages with apt-get; downloads nothing else. Errors: "ERROR: ..." and exit 1.
set -euo pipefail
ME=tests/peers/prometheus.sh
PEERS_DIR=${PEERS_DIR:-/tmp/peers}
DIR=$PEERS_DIR/prometheus
PORT=${PROM_PORT:-9090}
TPORT=${PROM_TEXTFILE_PORT:-9101}
LOG=$DIR/prometheus.log
URL=http://127.0.0.1:$PORT

die() {
  echo "$ME: ERROR: $*" >&2
  if [ -n "${STARTED:-}" ]; then tail -n 10 "$LOG" >&2 || true; fi
  exit 1
}
# What the peer scripts share: say, alive, port_busy, apt_install.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
prom_ready() { curl -fsS -m 5 "$URL/-/ready" >/dev/null 2>&1; }
# The last scrape of the textfile succeeded: up{job="gpu-textfile"}==1
series_ok() { curl -fsS -m 5 "$URL/api/v1/query?query=up%7Bjob%3D%22gpu-textfile%22%7D%3D%3D1" 2>/dev/null | grep -q '"value"'; }
healthy() { alive "$DIR/prometheus.pid" prometheus && alive "$DIR/textfile.pid" http.server && prom_ready && series_ok; }

stop() {
  local f name pid
  for f in "$DIR/prometheus.pid" "$DIR/textfile.pid"; do
    case $f in *prometheus.pid) name=prometheus ;; *) name=http.server ;; esac
    alive "$f" "$name" || continue
    pid=$(cat "$f"); kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  done
  rm -f "$DIR/prometheus.pid" "$DIR/textfile.pid"
}

# start_bg PIDFILE LOGFILE CMD...: in its own session (a Ctrl-C of tests/run leaves it), stdin
# closed; the pid of CMD itself goes to PIDFILE.
start_bg() {
  local pidfile=$1 log=$2; shift 2
  rm -f "$pidfile"
  setsid sh -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" </dev/null >"$log" 2>&1 &
  for _ in $(seq 1 50); do [ -s "$pidfile" ] && return 0; sleep 0.05; done
  die "could not start $1"
}

case "${1:-start}" in
  stop) stop; say "stopped"; exit 0 ;;
  status) if healthy; then say "running on $URL (textfile http://127.0.0.1:$TPORT/metrics)"; exit 0; fi
          say "not running"; exit 1 ;;
  start) ;;
  *) die "unknown command '$1' (start|stop|status)" ;;
esac
[[ "$PORT" =~ ^[0-9]+$ && "$TPORT" =~ ^[0-9]+$ ]] || die "PROM_PORT and PROM_TEXTFILE_PORT must be port numbers"

if healthy; then
  say "already running on $URL (textfile http://127.0.0.1:$TPORT/metrics)"; exit 0
fi

# Debian 12 packages (Prometheus 2.42.0, with promtool). Packaged services must not start
# (the packaged prometheus would listen on *:9090): a temporary policy-rc.d.
missing=""
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="$missing prometheus"
command -v python3 >/dev/null || missing="$missing python3"
command -v curl >/dev/null || missing="$missing curl"
command -v setsid >/dev/null || missing="$missing util-linux"
# shellcheck disable=SC2086
[ -z "$missing" ] || apt_install $missing
for c in prometheus promtool python3 curl setsid; do command -v "$c" >/dev/null || die "$c not found"; done
case "$(prometheus --version 2>&1 | head -n1)" in
  *"version 2.42."*) ;;
  *) echo "$ME: WARNING: $(prometheus --version 2>&1 | head -n1) is not Prometheus 2.42 (Debian 12)" >&2 ;;
esac

stop
for p in "$PORT" "$TPORT"; do
  port_busy "$p" && die "port 127.0.0.1:$p already in use (a system prometheus service? another http server?)"
done

T0=$(date +%s.%N)
rm -rf "$DIR"; mkdir -p "$DIR/data" "$DIR/textfile"
# Known series: DCGM-exporter style GPU metrics for the fake SLURM nodes gpu01..gpu04, 8 GPUs each.
{
  echo '# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).'
  echo '# TYPE DCGM_FI_DEV_GPU_TEMP gauge'
  for n in 1 2 3 4; do for g in 0 1 2 3 4 5 6 7; do
    echo "DCGM_FI_DEV_GPU_TEMP{Hostname=\"gpu0$n\",gpu=\"$g\",modelName=\"NVIDIA H100 80GB HBM3\"} $((40 + n + g))"
  done; done
  echo '# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.'
  echo '# TYPE DCGM_FI_DEV_XID_ERRORS gauge'
  for n in 1 2 3 4; do for g in 0 1 2 3 4 5 6 7; do
    v=0; [ "$n$g" = "23" ] && v=79
    echo "DCGM_FI_DEV_XID_ERRORS{Hostname=\"gpu0$n\",gpu=\"$g\"} $v"
  done; done
  echo '# HELP node_up Fake per-host liveness.'
  echo '# TYPE node_up gauge'
  echo 'node_up{instance="gpu01"} 1'
  echo 'node_up{instance="gpu02"} 1'
  echo 'node_up{instance="gpu03"} 0'
  echo 'node_up{instance="gpu04"} 1'
} >"$DIR/textfile/metrics"

cat >"$DIR/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpu-textfile
    honor_labels: true
    static_configs:
      - targets: ['127.0.0.1:$TPORT']
EOF
promtool check config "$DIR/prometheus.yml" >/dev/null 2>&1 || die "promtool check config $DIR/prometheus.yml failed"

# The system python where there is one: a version manager's shim (pyenv)
# execs through a chain of scripts, and a pid read mid-exec shows no
# command line for a moment.
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
start_bg "$DIR/textfile.pid" "$DIR/textfile.log" \
  "$PY" -m http.server "$TPORT" --bind 127.0.0.1 --directory "$DIR/textfile"
start_bg "$DIR/prometheus.pid" "$LOG" \
  prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/data" \
  --web.listen-address="127.0.0.1:$PORT" --web.enable-lifecycle --web.enable-admin-api \
  --web.enable-remote-write-receiver --storage.tsdb.retention.time=1d
STARTED=1

for _ in $(seq 1 150); do
  prom_ready && series_ok && break
  alive "$DIR/prometheus.pid" prometheus || die "prometheus exited during startup (log: $LOG)"
  alive "$DIR/textfile.pid" http.server || { sleep 0.5; alive "$DIR/textfile.pid" http.server; } \
    || { tail -n 5 "$DIR/textfile.log" >&2 || true; die "the textfile http.server exited (port $TPORT?)"; }
  sleep 0.2
done
series_ok || die "no scraped series from http://127.0.0.1:$TPORT/metrics after 30 s"
ELAPSED=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
say "ready: $URL ($(prometheus --version 2>&1 | head -n1 | awk '{print $3}'), textfile http://127.0.0.1:$TPORT/metrics) in ${ELAPSED}s"
