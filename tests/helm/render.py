#!/usr/bin/env python3
"""Renders helm/fleet with Helm's own library (helm-python-sdk) and prints,
as JSON, every workload's command and environment:

    {"<kind>/<name>": {"args": [...], "env": {"NAME": "value" |
      {"secret": "<name>", "key": "<key>"}}}}

With --validate, also checks every rendered manifest against the
Kubernetes schemas (kubernetes-validate); with --manifests prints every
rendered object instead; --name=R renders release R. Extra arguments
`a.b=c` set values (`nats.tls.enabled=true`).

Needs: pip install helm-python-sdk kubernetes-validate pyyaml
"""
import json
import os
import sys

try:
    import helm_python as helm
    import yaml
except ImportError as e:  # say how to get it, never pass quietly
    sys.exit(f"render.py: {e}; install with: python3 -m pip install helm-python-sdk kubernetes-validate pyyaml")

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "helm", "fleet")


def values_from(args):
    values = {}
    for a in args:
        key, _, value = a.partition("=")
        node = values
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = {"true": True, "false": False}.get(value, value)
    return values


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    validate = "--validate" in sys.argv
    name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--name=")), "fleet")
    for d in docs_of(name, values_from(args), validate):
        pass
    out = workloads(docs_of(name, values_from(args), False))
    if "--manifests" in sys.argv:
        json.dump([doc for _, doc in docs_of(name, values_from(args), False)], sys.stdout, indent=1)
    else:
        json.dump(out, sys.stdout, indent=1, sort_keys=True)


def docs_of(name, values, validate):
    chart = helm.Chart.load(CHART)
    rendered = chart.render(values=values, name=name, namespace="fleet", is_install=True)
    docs = []
    for path, text in sorted(rendered.items()):
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((path, doc))
    if validate:
        import kubernetes_validate
        for path, doc in docs:
            if doc.get("kind") == "ServiceMonitor":
                continue  # a CRD: not in the Kubernetes schemas
            try:
                kubernetes_validate.validate(doc, "1.30", strict=True)
            except Exception as e:  # noqa: BLE001 - report every kind of refusal
                sys.exit(f"render.py: {path} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}: {e}")
    return docs


def workloads(docs):
    out = {}
    for _, doc in docs:
        if doc.get("kind") not in ("Deployment", "StatefulSet", "Job"):
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "nats":
                continue  # the NATS servers (templates/nats.yaml), not a fleet service
            env = {}
            for e in c.get("env", []):
                if "value" in e:
                    env[e["name"]] = str(e["value"])
                elif "fieldRef" in e["valueFrom"]:
                    # The downward API: the first pod's name, as a cluster sets it.
                    field = e["valueFrom"]["fieldRef"]["fieldPath"]
                    if field != "metadata.name":
                        sys.exit(f"render.py: {doc['metadata']['name']}: unexpected fieldRef {field}")
                    env[e["name"]] = f"{doc['metadata']['name']}-0"
                else:
                    ref = e["valueFrom"]["secretKeyRef"]
                    env[e["name"]] = {"secret": ref["name"], "key": ref["key"]}
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = {"args": c.get("args", []), "env": env}
    return out


main()
