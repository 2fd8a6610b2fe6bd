#!/usr/bin/env python3
"""Checks over the rendered helm/fleet (tests/run runs it; exits non-zero
with every failure listed). Renders with Helm's own library through
render.py and asserts what an SRE expects of the chart."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CONNECTORS = ["netbox", "openstack", "slurm", "health", "borneo", "fabric"]
failures = []


def render(*args, name="fleet"):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "render.py"), "--manifests", "--validate", f"--name={name}", *args],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def check(ok, what):
    if not ok:
        failures.append(what)


def containers(doc):
    return doc["spec"]["template"]["spec"]["containers"]


all_on = [f"services.connector-{c}.enabled=true" for c in CONNECTORS]
docs = render(*all_on, "services.connector-slurm.secretEnv.FLEET__CONNECTORS__SLURM__SITES__S1__TOKEN__VALUE.secret=slurm-jwt",
              "services.connector-slurm.secretEnv.FLEET__CONNECTORS__SLURM__SITES__S1__TOKEN__VALUE.key=token",
              "services.connector-slurm.env.FLEET__CONNECTORS__SLURM__SITES__S1__URL=https://slurm.example")
by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]

# Every connector can be enabled, and is configured from its own section,
# its secrets from Secrets.
for c in CONNECTORS:
    check(("Deployment", f"fleet-connector-{c}") in by, f"connector-{c} can be enabled")
slurm = containers(by[("Deployment", "fleet-connector-slurm")])[0]["env"]
env = {e["name"]: e for e in slurm}
check(env.get("FLEET__CONNECTORS__SLURM__SITES__S1__URL", {}).get("value") == "https://slurm.example",
      "connector-slurm takes its own configuration")
check(env.get("FLEET__CONNECTORS__SLURM__SITES__S1__TOKEN__VALUE", {}).get("valueFrom", {}).get("secretKeyRef")
      == {"name": "slurm-jwt", "key": "token"}, "connector-slurm takes its token from a Secret")
# Each service may use a database user of its own (its PostgreSQL role);
# without one it uses database.urlSecret.
own = render("services.api.databaseUrlSecret.name=fleet-db-api", "services.api.databaseUrlSecret.key=url",
             "hub.databaseUrlSecret.name=fleet-db-hub", "hub.databaseUrlSecret.key=url")
own_by = {(d["kind"], d["metadata"]["name"]): d for d in own}
def db_secret(doc):
    env = {e["name"]: e for e in containers(doc)[0]["env"]}
    return env["FLEET__DATABASE__URL"]["valueFrom"]["secretKeyRef"]["name"]
check(db_secret(own_by[("Deployment", "fleet-api")]) == "fleet-db-api", "the API takes its own database URL")
hubs = [d for (k, n), d in own_by.items() if k == "StatefulSet" and n.startswith("fleet-hub")]
check(hubs and all(db_secret(d) == "fleet-db-hub" for d in hubs), "the hub takes its own database URL")
check(db_secret(own_by[("Deployment", "fleet-placer")]) == "fleet-database", "the placer keeps database.urlSecret")

# Disabled by default: not deployed, so never crash-looping unconfigured.
default = render()
for c in CONNECTORS:
    check(not any(d["metadata"]["name"] == f"fleet-connector-{c}" for d in default),
          f"connector-{c} is not deployed until enabled")

for d in workloads:
    name = f"{d['kind']}/{d['metadata']['name']}"
    pod = d["spec"]["template"]["spec"]
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{name}: runs as non-root")
    check(pod.get("automountServiceAccountToken") is False, f"{name}: no service account token")
    for c in containers(d):
        sc = c.get("securityContext", {})
        check(sc.get("readOnlyRootFilesystem") is True, f"{name}: read-only root filesystem")
        check(sc.get("allowPrivilegeEscalation") is False, f"{name}: no privilege escalation")
        check("ALL" in sc.get("capabilities", {}).get("drop", []), f"{name}: drops every capability")
        check(bool(c.get("resources", {}).get("requests")), f"{name}: resource requests")
        check(bool(c.get("resources", {}).get("limits")), f"{name}: resource limits")
        for e in c.get("env", []):
            secretish = any(w in e["name"] for w in ("PASSWORD", "TOKEN__VALUE", "SECRET"))
            check(not (secretish and "value" in e), f"{name}: {e['name']} is not a plain value")
        # NATS answers /healthz only: ready once JetStream is.
        ready = "/healthz?js-enabled-only=true" if c["name"] == "nats" else "/readyz"
        if d["kind"] != "Job":
            check(c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", f"{name}: liveness on /healthz")
            check(c.get("readinessProbe", {}).get("httpGet", {}).get("path") == ready, f"{name}: readiness on {ready}")
            check(d["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true",
                  f"{name}: scrape annotations")
    labels = d["metadata"]["labels"]
    for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
              "app.kubernetes.io/managed-by"):
        check(k in labels, f"{name}: label {k}")

# The hubs' StatefulSets name a Service the chart creates; a PDB covers them.
for d in workloads:
    if d["kind"] == "StatefulSet":
        check(("Service", d["spec"]["serviceName"]) in by, f"{d['metadata']['name']}: its serviceName exists")
pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
check(any(p["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component") == "nats" for p in pdbs),
      "a PodDisruptionBudget for the NATS cluster")

# A 3-node NATS cluster whose routes name every server, every stream at
# three replicas, and every service given the cluster's address.
nats = by[("StatefulSet", "fleet-nats")]
check(nats["spec"]["replicas"] == 3, "NATS runs three servers")
conf = by[("ConfigMap", "fleet-nats-cluster")]["data"]
check(all(f"nats://fleet-nats-{i}.fleet-nats-headless:6222" in conf["cluster.conf"] for i in range(3)),
      "the NATS routes name every server")
check("include ./nats.conf" in conf["cluster.conf"] and "users: [" in conf["nats.conf"],
      "every NATS server runs the shipped users and permissions")
for d in workloads:
    for c in containers(d):
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if "FLEET__NATS__URL" in env:
            check(env["FLEET__NATS__URL"] == "nats://fleet-nats:4222", f"{d['metadata']['name']}: NATS is the cluster")
            check(env.get("FLEET__NATS__NUM_REPLICAS") == "3", f"{d['metadata']['name']}: streams at three replicas")
tls = {(d["kind"], d["metadata"]["name"]): d for d in render("nats.tls.enabled=true")}
check("tls {" in tls[("ConfigMap", "fleet-nats-cluster")]["data"]["cluster.conf"],
      "with nats.tls the servers serve TLS")
external = render("nats.deploy=false", "nats.host=nats.example")
check(not any(d["metadata"]["name"] == "fleet-nats" for d in external), "nats.deploy=false runs no NATS")
check(any(p["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component") == "hub" for p in pdbs),
      "a PodDisruptionBudget for the hub")

# The API writes (tokens): it runs on the primary's URL.
api_env = {e["name"]: e for e in containers(by[("Deployment", "fleet-api")])[0]["env"]}
check(api_env["FLEET__DATABASE__URL"]["valueFrom"]["secretKeyRef"]["key"] == "url", "the API uses the primary URL")

# The migrate hook cleans up after itself.
jobs = [d for d in docs if d["kind"] == "Job"]
check(all("hook-succeeded" in j["metadata"]["annotations"].get("helm.sh/hook-delete-policy", "") for j in jobs),
      "the migrate hook has a delete policy")

# Two releases share a namespace: no object name in common.
other = render(name="second")
names = {(d["kind"], d["metadata"]["name"]) for d in default}
check(not names & {(d["kind"], d["metadata"]["name"]) for d in other}, "two releases share no object name")

# An optional ServiceMonitor.
check(any(d["kind"] == "ServiceMonitor" for d in render("metrics.serviceMonitor.enabled=true")),
      "a ServiceMonitor when asked")

if failures:
    print("tests/helm/check.py: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"tests/helm/check.py: {len(workloads)} workloads, every check passed")
