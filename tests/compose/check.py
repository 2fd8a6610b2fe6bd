#!/usr/bin/env python3
"""Validates compose.yaml against the Compose Specification's JSON schema
(the one the `docker-compose` package on PyPI ships, fetched with pip into
a cache), and checks what the stack needs: every fleet service has a
healthcheck, waits for a healthy NATS, and no host port collides with a
local NATS (4222, 8222) or PostgreSQL (5432)."""
import glob
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(tempfile.gettempdir(), "fleet-compose-spec")


def schema():
    path = os.path.join(CACHE, "compose_spec.json")
    if not os.path.exists(path):
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", CACHE, "docker-compose==1.29.2"],
            check=True,
        )
        wheel = glob.glob(os.path.join(CACHE, "docker_compose-*.whl"))[0]
        with zipfile.ZipFile(wheel) as z, open(path, "wb") as f:
            f.write(z.read("compose/config/compose_spec.json"))
    return json.load(open(path))


doc = yaml.safe_load(open(os.path.join(HERE, "..", "..", "compose.yaml")))
failures = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft201909Validator(schema()).iter_errors(doc)]
for name, svc in doc["services"].items():
    for p in svc.get("ports", []):
        host = str(p).split(":")[0]
        if host in ("4222", "8222", "5432"):
            failures.append(f"{name}: host port {host} collides with a local NATS or PostgreSQL")
    fleet = svc.get("image", "").startswith("fleet")
    if fleet and name != "migrate":
        if "healthcheck" not in svc:
            failures.append(f"{name}: no healthcheck")
        if svc.get("depends_on", {}).get("nats", {}).get("condition") != "service_healthy":
            failures.append(f"{name}: does not wait for a healthy NATS")
if "healthcheck" not in doc["services"]["nats"]:
    failures.append("nats: no healthcheck")
if failures:
    print("tests/compose/check.py: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"tests/compose/check.py: compose.yaml is valid ({len(doc['services'])} services)")
