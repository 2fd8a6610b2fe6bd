#!/usr/bin/env bash
# tests/peers/slurm.sh: the real SLURM 22.05 that connector-slurm's integration test reads
# (services/connector-slurm/tests/it/slurm_real.rs). tests/run calls it (`start`) before cargo test.
# A single-machine cluster, all on 127.0.0.1, Debian 12 packages, run as root:
#   munged     unix socket $DIR/munge/run/munge.socket (own key, not the system munged)
#   slurmctld  127.0.0.1:6817
#   slurmd x N one per fake node gpu01..gpuNN (NodeAddr=127.0.0.1, ports 17001..), each claiming
#              64 CPUs / 500 GiB / gres gpu:h100:8 (SlurmdParameters=config_overrides; fake devices)
#   slurmrestd 127.0.0.1:6820, rest_auth/jwt, OpenAPI v0.0.36/37/38; JWT for root in $DIR/jwt.token
# Usage: tests/peers/slurm.sh [start|stop|status|token]   (default start)
#   start:  idempotent: says so and exits 0 when already running and healthy. When slurmctld is
#           not running, the state is wiped and the cluster starts fresh.
#   token:  print a fresh JWT for root (lifespan 1 day).
# Env: PEERS_DIR (/tmp/peers), SLURM_NODES (6, max 99), SLURM_REST_PORT (6820); $DIR=$PEERS_DIR/slurm
# Client: curl -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $(cat /tmp/peers/slurm/jwt.token)" \
#           http://127.0.0.1:6820/slurm/v0.0.38/nodes
# The token is also mintable offline: HS256 over {"exp":..,"iat":..,"sun":"root"} with key $DIR/etc/jwt.key.
# Installs missing Debian packages with apt-get; downloads nothing else. Errors: "ERROR: ..." and exit 1.
set -euo pipefail
ME=tests/peers/slurm.sh
PEERS_DIR=${PEERS_DIR:-/tmp/peers}
DIR=$PEERS_DIR/slurm
NODES=${SLURM_NODES:-6}
REST_PORT=${SLURM_REST_PORT:-6820}
CTLD_PORT=6817
NODE_PORT_BASE=17000
export SLURM_CONF=$DIR/etc/slurm.conf
MSOCK=$DIR/munge/run/munge.socket
REST_USER=nobody        # slurmrestd refuses to run as root
REST_GROUP=nogroup
PLUGINS=openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38   # dbv0.0.x need slurmdbd: left out
PKGS="munge slurmctld slurmd slurmrestd slurm-client slurm-wlm-basic-plugins slurm-wlm-jwt-plugin curl"

die() { echo "$ME: ERROR: $*" >&2; exit 1; }
log_tail() { [ -f "$1" ] && tail -n 15 "$1" >&2; true; }
# What the peer scripts share: say, alive, port_busy, apt_install.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
have_slurm() { command -v scontrol >/dev/null 2>&1; }
node_names() { for i in $(seq 1 "$NODES"); do printf 'gpu%02d\n' "$i"; done; }
munge_ok() { [ -S "$MSOCK" ] && munge -S "$MSOCK" -n 2>/dev/null | unmunge -S "$MSOCK" >/dev/null 2>&1; }
ctld_ok() { have_slurm && [ -f "$SLURM_CONF" ] && timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }
token() { scontrol token username=root lifespan=86400 | sed 's/^SLURM_JWT=//'; }
write_token() {   # atomically, so a test never reads half a token
  local t; t=$(token) && [ -n "$t" ] || die "scontrol token failed"
  printf '%s\n' "$t" >"$DIR/jwt.token.new" && chmod 644 "$DIR/jwt.token.new" && mv -f "$DIR/jwt.token.new" "$DIR/jwt.token"
}
rest_ok() {
  [ -s "$DIR/jwt.token" ] || return 1
  curl -fsS -m 5 -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $(cat "$DIR/jwt.token")" \
    "http://127.0.0.1:$REST_PORT/slurm/v0.0.38/ping" 2>/dev/null | grep -q '"UP"'
}
# Every node registered: none unknown / not responding / invalid, and exactly $NODES of them.
nodes_ok() {
  local states
  states=$(sinfo -N -h -o '%T' 2>/dev/null | sort -u | tr '\n' ' ')
  [ -n "$states" ] && ! grep -qE 'unknown|\*|inval|not_responding' <<<"$states" \
    && [ "$(sinfo -N -h -o '%N' 2>/dev/null | sort -u | wc -l)" -eq "$NODES" ]
}
slurmds_ok() { local n; for n in $(node_names); do alive "$DIR/run/slurmd-$n.pid" slurmd || return 1; done; }
# The running slurm.conf is the one this script renders (node count and features): compared on the
# NodeName lines, which are all that SLURM_NODES and this script's versions change.
# Feature=...,<node>: a burn-in job pins its node with a constraint naming it (slurmrestd 22.05
# ignores required_nodes and #SBATCH --nodelist), so every node carries its own name as a feature.
node_lines() {
  local i=0 n
  for n in $(node_names); do i=$((i+1))
    echo "NodeName=$n NodeAddr=127.0.0.1 NodeHostname=localhost Port=$((NODE_PORT_BASE+i)) Feature=h100,ib,$n"
  done
}
conf_current() { [ "$(grep '^NodeName=gpu' "$SLURM_CONF" 2>/dev/null)" = "$(node_lines)" ]; }
healthy() {
  munge_ok && ctld_ok && slurmds_ok && nodes_ok && alive "$DIR/run/slurmrestd.pid" slurmrestd && rest_ok
}

stop_all() {
  if ctld_ok; then
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    for _ in $(seq 1 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  local pids="" f name
  for f in "$DIR/run/slurmrestd.pid" "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/munge/run/munged.pid"; do
    case $f in *slurmrestd.pid) name=slurmrestd ;; *slurmd-*) name=slurmd ;; *slurmctld.pid) name=slurmctld ;; *) name=munged ;; esac
    alive "$f" "$name" && pids="$pids $(cat "$f")"
  done
  [ -n "$pids" ] || { rm -f "$DIR/run/slurmrestd.pid"; return 0; }
  kill $pids 2>/dev/null || true
  local left="" p
  for _ in $(seq 1 100); do   # up to 10 s for all of them, then SIGKILL the rest
    left=""; for p in $pids; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -z "$left" ] && break; sleep 0.1
  done
  [ -n "$left" ] && kill -9 $left 2>/dev/null || true
  rm -f "$DIR/run/slurmrestd.pid"
}

case "${1:-start}" in
  stop) [ -d "$DIR" ] && stop_all; say "stopped"; exit 0 ;;
  status)
    if ctld_ok && rest_ok; then sinfo -N -h -o '%N %T'; say "running (REST http://127.0.0.1:$REST_PORT)"; exit 0; fi
    say "not running"; exit 1 ;;
  token) ctld_ok || die "slurmctld is not running (start it: $0 start)"; token; exit 0 ;;
  start) ;;
  *) die "unknown command '$1' (start|stop|status|token)" ;;
esac
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 99 ] || die "SLURM_NODES must be 1..99"
[[ "$REST_PORT" =~ ^[0-9]+$ ]] || die "SLURM_REST_PORT must be a port number"

# A daemon started from a directory that was removed since (a CI clone) fails
# its next getcwd: slurmrestd aborts on a job submission. Such a cluster is
# restarted; daemons start from / so it cannot happen again.
cwds_ok() {
  local f pid
  for f in "$DIR"/run/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in *"(deleted)") return 1 ;; esac
  done
  return 0
}
cd /

# Already running and healthy: say so and leave it alone (refresh the token when older than 12 h;
# the old one stays valid for its day).
if healthy && conf_current && cwds_ok; then
  if [ -n "$(find "$DIR/jwt.token" -mmin +720 2>/dev/null)" ]; then write_token; fi
  say "already running: nodes=$(sinfo -h -o %N), REST http://127.0.0.1:$REST_PORT/slurm/v0.0.38/ (token $DIR/jwt.token)"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root (munged and slurmd run as root, slurmrestd as $REST_USER)"

# Debian 12 packages (SLURM 22.05.8). Packaged services must not start: a temporary policy-rc.d.
missing=""; for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# shellcheck disable=SC2086
[ -z "$missing" ] || apt_install $missing
for c in munged slurmctld slurmd slurmrestd scontrol sinfo curl; do
  command -v "$c" >/dev/null || die "$c not found after installing$PKGS"
done
case "$(slurmctld -V 2>/dev/null)" in
  *" 22.05."*) ;;
  *) echo "$ME: WARNING: $(slurmctld -V 2>&1) is not SLURM 22.05 (Debian 12): the tests expect 22.05's v0.0.38 API" >&2 ;;
esac
id "$REST_USER" >/dev/null 2>&1 || die "user $REST_USER missing"
getent group "$REST_GROUP" >/dev/null || die "group $REST_GROUP missing"

T0=$(date +%s.%N)

if ! ctld_ok || ! cwds_ok; then
  # Fresh cluster: anything left over from an earlier run goes.
  stop_all 2>/dev/null || true
  rm -rf "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run" "$DIR/jwt.token"
fi
mkdir -p "$DIR"/{etc,state,spool,log,run,dev,munge/key,munge/run}
chmod 755 "$DIR" "$DIR/munge" "$DIR/munge/run"; chmod 700 "$DIR/munge/key"   # munged is picky

# Keys (kept across restarts).
if [ ! -s "$DIR/munge/key/munge.key" ]; then
  dd if=/dev/urandom of="$DIR/munge/key/munge.key" bs=1024 count=1 status=none; chmod 400 "$DIR/munge/key/munge.key"
fi
if [ ! -s "$DIR/etc/jwt.key" ]; then
  dd if=/dev/urandom of="$DIR/etc/jwt.key" bs=32 count=1 status=none; chmod 600 "$DIR/etc/jwt.key"
fi
# Fake GPU device files: gres/gpu drops File-less GPUs, and wants char devices.
for i in 0 1 2 3 4 5 6 7; do
  [ -e "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i" 2>/dev/null || touch "$DIR/dev/nvidia$i"
done

LAST=$(printf 'gpu%02d' "$NODES")
{
cat <<EOF
ClusterName=peers
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MSOCK
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$DIR/etc/jwt.key
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
MpiDefault=none
SwitchType=switch/none
GresTypes=gpu
NodeName=DEFAULT CPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=16 ThreadsPerCore=2 RealMemory=512000 Gres=gpu:h100:8 Feature=h100,ib State=UNKNOWN
EOF
node_lines
echo "PartitionName=gpu Nodes=gpu[01-${LAST#gpu}] Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF.new"
printf 'AutoDetect=off\nNodeName=gpu[01-%s] Name=gpu Type=h100 File=%s/dev/nvidia[0-7]\n' "${LAST#gpu}" "$DIR" >"$DIR/etc/gres.conf"
if [ -f "$SLURM_CONF" ] && ! cmp -s "$SLURM_CONF" "$SLURM_CONF.new" && ctld_ok; then
  # An older cluster (another SLURM_NODES, or this script changed): restart it fresh.
  say "the running cluster has a different config: restarting it"
  stop_all; rm -rf "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run" "$DIR/jwt.token"
  mkdir -p "$DIR"/{state,spool,log,run}
fi
mv "$SLURM_CONF.new" "$SLURM_CONF"; chmod 644 "$SLURM_CONF" "$DIR/etc/gres.conf"

# 1. munged
if ! munge_ok; then
  munged -S "$MSOCK" --key-file="$DIR/munge/key/munge.key" --pid-file="$DIR/munge/run/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/key/munged.seed" \
    || { log_tail "$DIR/log/munged.log"; die "munged failed to start"; }
  for _ in $(seq 1 50); do munge_ok && break; sleep 0.1; done
  munge_ok || { log_tail "$DIR/log/munged.log"; die "munge credential round trip failed"; }
fi

# 2. slurmctld
if ! ctld_ok || ! cwds_ok; then
  port_busy "$CTLD_PORT" && die "port 127.0.0.1:$CTLD_PORT is busy (another slurmctld?)"
  slurmctld -f "$SLURM_CONF" -i || { log_tail "$DIR/log/slurmctld.log"; die "slurmctld failed to start"; }
  for _ in $(seq 1 100); do
    ctld_ok && break
    [ -s "$DIR/run/slurmctld.pid" ] && ! alive "$DIR/run/slurmctld.pid" slurmctld && break   # it died
    sleep 0.1
  done
  ctld_ok || { log_tail "$DIR/log/slurmctld.log"; die "slurmctld is not answering scontrol ping"; }
fi

# 3. one slurmd per fake node
for n in $(node_names); do
  alive "$DIR/run/slurmd-$n.pid" slurmd && continue
  mkdir -p "$DIR/spool/$n"
  slurmd -f "$SLURM_CONF" -N "$n" || { log_tail "$DIR/log/slurmd-$n.log"; die "slurmd $n failed to start"; }
done

# 4. wait until every node registered (no UNKNOWN / not-responding nodes)
ok=""
for _ in $(seq 1 150); do nodes_ok && { ok=1; break; }; sleep 0.2; done
[ -n "$ok" ] || { sinfo -N -l >&2 || true; log_tail "$DIR/log/slurmctld.log"; die "nodes did not register within 30 s"; }

# 5. slurmrestd. SLURM_JWT=daemon: pass client JWTs through to slurmctld (without it every token
#    is rejected). setsid: not in the caller's process group, so a Ctrl-C of tests/run leaves it.
write_token
if ! alive "$DIR/run/slurmrestd.pid" slurmrestd || ! rest_ok; then
  if alive "$DIR/run/slurmrestd.pid" slurmrestd; then
    pid=$(cat "$DIR/run/slurmrestd.pid"); kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$DIR/run/slurmrestd.pid"
  port_busy "$REST_PORT" && die "port 127.0.0.1:$REST_PORT is busy (another slurmrestd?)"
  SLURM_JWT=daemon setsid sh -c 'echo $$ >"$0"; exec "$@"' "$DIR/run/slurmrestd.pid" \
    slurmrestd -f "$SLURM_CONF" -a rest_auth/jwt -s "$PLUGINS" -u "$REST_USER" -g "$REST_GROUP" \
    "127.0.0.1:$REST_PORT" </dev/null >"$DIR/log/slurmrestd.log" 2>&1 &
  for _ in $(seq 1 50); do [ -s "$DIR/run/slurmrestd.pid" ] && break; sleep 0.05; done
  for _ in $(seq 1 100); do rest_ok && break; alive "$DIR/run/slurmrestd.pid" slurmrestd || break; sleep 0.1; done
  rest_ok || { log_tail "$DIR/log/slurmrestd.log"; die "slurmrestd is not serving http://127.0.0.1:$REST_PORT/slurm/v0.0.38/ping"; }
fi

ELAPSED=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
say "ready: $(slurmctld -V) nodes=$(sinfo -h -o %N) in ${ELAPSED}s"
echo "  SLURM_CONF=$SLURM_CONF"
echo "  REST: http://127.0.0.1:$REST_PORT/slurm/v0.0.38/nodes  headers X-SLURM-USER-NAME: root, X-SLURM-USER-TOKEN: \$(cat $DIR/jwt.token)"
