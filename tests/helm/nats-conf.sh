#!/usr/bin/env bash
# tests/helm/nats-conf.sh: the shipped nats.conf, and the chart's cluster
# configuration of its NATS StatefulSet (which includes it), as the
# nats-server first on PATH reads them (`nats-server -t`). tests/run calls
# it with the machine's server, tests/nats-release.sh with the release
# compose and Helm run. Needs tests/helm/render.py's Python modules.
set -euo pipefail
cd "$(dirname "$0")/../.."
version="$(nats-server --version)"
natsconf="$(mktemp -d)"
trap 'rm -rf "$natsconf"' EXIT
python3 tests/helm/render.py --manifests | python3 -c '
import json, os, sys
docs = json.load(sys.stdin)
cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fleet-nats-cluster")
for k, v in cm["data"].items():
    open(os.path.join(sys.argv[1], k), "w").write(v)
' "$natsconf"
for u in HUB CONNECTOR_NETBOX CONNECTOR_OPENSTACK CONNECTOR_SLURM CONNECTOR_HEALTH CONNECTOR_BORNEO CONNECTOR_FABRIC GATEWAY AGENT PLACER RADAR API READER WORKFLOW; do
  export "FLEET_NATS_${u}_PASSWORD=check"
done
check() {
  local out
  out="$("$@" 2>&1)" || { echo "$out" >&2; echo "tests/helm/nats-conf: ERROR: $version rejects: ${*: -1}" >&2; exit 1; }
}
check nats-server -t -c helm/fleet/files/nats.conf
POD_NAME=fleet-nats-0 check nats-server -t -c "$natsconf/cluster.conf"
echo "tests/helm/nats-conf: $version accepts helm/fleet/files/nats.conf and the chart's cluster.conf"
