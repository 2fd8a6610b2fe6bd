#!/usr/bin/env python3
"""Follow the fleet's status changes from another language.

Reads `StatusChanged` events from the STATUS stream (docs/subjects.md),
from the beginning (--from-start) or from now, with an ephemeral ordered
consumer of its own, and prints one line per event; --radar follows the
Radar feed instead. Protobuf types are generated from the repository's
schemas/ at start (grpcio-tools ships protoc).

    pip install nats-py protobuf grpcio-tools
    python3 examples/python/follow_status.py --from-start --limit 10

Exits 0 after --limit events, 1 when fewer arrived within --timeout.
"""
import argparse
import asyncio
import atexit
import glob
import os
import shutil
import sys
import tempfile

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def load_schemas():
    """Compiles schemas/fleet/v1/*.proto into a temporary package."""
    from grpc_tools import protoc
    import grpc_tools

    out = tempfile.mkdtemp(prefix="fleet-pb-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    schemas = os.path.join(ROOT, "schemas")
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    files = sorted(glob.glob(os.path.join(schemas, "fleet", "v1", "*.proto")))
    if protoc.main(["protoc", f"-I{schemas}", f"-I{include}", f"--python_out={out}", *files]) != 0:
        sys.exit("follow_status: protoc failed")
    sys.path.insert(0, out)
    from fleet.v1 import radar_pb2, status_pb2  # noqa: E402

    return status_pb2, radar_pb2


async def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--user", default=os.environ.get("NATS_USER"), help="e.g. reader (nats.conf)")
    p.add_argument("--password", default=os.environ.get("NATS_PASSWORD"))
    p.add_argument("--root", default="fleet", help="nats.subject_root")
    p.add_argument("--radar-root", default="radar", help="nats.radar_root")
    p.add_argument("--stream-prefix", default="", help="nats.stream_prefix")
    p.add_argument("--radar", action="store_true", help="follow the Radar feed instead")
    p.add_argument("--from-start", action="store_true", help="replay what the stream holds first")
    p.add_argument("--limit", type=int, default=0, help="stop after this many events (0: never)")
    p.add_argument("--timeout", type=float, default=0, help="give up after this many seconds (0: never)")
    a = p.parse_args()
    status_pb2, radar_pb2 = load_schemas()

    kwargs = {"inbox_prefix": f"_INBOX.{a.user}".encode()} if a.user else {}
    nc = await nats.connect(a.url, user=a.user, password=a.password, **kwargs)
    js = nc.jetstream()
    if a.radar:
        stream, subject = f"{a.stream_prefix}RADAR", f"{a.radar_root}.projection.v1.>"
    else:
        stream, subject = f"{a.stream_prefix}STATUS", f"{a.root}.status.>"
    policy = DeliverPolicy.ALL if a.from_start else DeliverPolicy.NEW
    try:
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True,
                                 config=ConsumerConfig(deliver_policy=policy))
    except nats.js.errors.NotFoundError:
        sys.exit(f"follow_status: stream {stream} not found; is the hub running "
                 f"(it creates the streams) and is --stream-prefix right?")
    seen = 0
    deadline = asyncio.get_running_loop().time() + a.timeout if a.timeout else None
    try:
        while not a.limit or seen < a.limit:
            wait = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if wait is not None and wait <= 0:
                break
            try:
                msg = await sub.next_msg(timeout=wait if wait is not None else 3600)
            except nats.errors.TimeoutError:
                if deadline is not None:
                    break
                continue
            trace = (msg.headers or {}).get("traceparent", "-")
            if a.radar:
                r = radar_pb2.RadarProjection()
                r.ParseFromString(msg.data)
                print(f"{msg.subject} {r}".replace("\n", " "))
            else:
                e = status_pb2.StatusChanged()
                e.ParseFromString(msg.data)
                # Contract v2 (docs/subjects.md): a birth is one `device`
                # event with every axis's first value; a transaction's
                # condition changes are one `conditions` event.
                if e.axis == "device":
                    change = "born " + " ".join(f"{a.axis}={a.value}" for a in e.axes)
                elif e.axis == "conditions":
                    change = " ".join(f"{c.condition_type}:{c.from_status or '(new)'}->{c.to_status}"
                                      for c in e.conditions)
                else:
                    change = f"{e.from_value} -> {e.to}"
                print(f"{e.device_id} {e.axis}: {change} v{e.version} (schema v{e.schema_version or 1}) "
                      f"{e.cause} trace {trace}")
            seen += 1
    finally:
        await nc.close()
    if a.limit and seen < a.limit:
        print(f"follow_status: {seen} of {a.limit} events within {a.timeout} s", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main())
