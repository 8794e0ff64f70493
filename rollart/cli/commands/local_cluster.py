"""`rollart local-cluster --node RESOURCES [--node RESOURCES …]`: a Ray cluster of several nodes on this machine,
on 127.0.0.1, for trying a run's pools and `cluster.address` before a real cluster (docs/cluster.md).

Each `--node` is one node's custom resources as JSON (`'{"pool_train": 1, "pool_env": 4}'`); the first is the head.
It starts the nodes (rollart/resources/loopback.py: why plain `ray start` cannot make a loopback cluster), prints
the address and the `cluster.address=…` override a run joins it with, and stays in the foreground until Ctrl-C or
SIGTERM, which stops every process it started (and only those: each node's Ray runs under a temp dir of its own)
and removes that temp dir.
A node that dies on its own ends it too, with exit 1. A `--node` that is not a JSON object of non-negative
numbers exits 2 before anything starts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from rollart.config.loader import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("local-cluster", help="start a multi-node Ray cluster on 127.0.0.1 to join with "
                                                  "cluster.address (Ctrl-C stops it)")
    parser.add_argument("--node", action="append", required=True, metavar="RESOURCES",
                        help="a node's custom resources as JSON, e.g. '{\"pool_train\": 1}' (repeat per node; the "
                             "first is the head)")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs each node declares to Ray (default 1)")
    parser.add_argument("--object-store-mb", type=int, default=100, help="each node's object store (MB)")
    parser.set_defaults(func=_run)


def node_resources(text: str) -> dict[str, float]:
    """One `--node` value: a JSON object of resource name → amount ≥ 0."""
    try:
        value: Any = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--node {text!r}: not JSON ({exc}); give an object such as '{{\"pool_train\": 1}}'") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, (int, float))
                                              and not isinstance(v, bool) and v >= 0 for k, v in value.items()):
        raise ConfigError(f"--node {text!r}: expected a JSON object of resource names to amounts ≥ 0, e.g. "
                          "'{\"pool_train\": 1, \"pool_env\": 4}'")
    return {k: float(v) for k, v in value.items()}


def _run(args: argparse.Namespace) -> int:
    nodes = [node_resources(text) for text in args.node]
    if args.cpus < 1 or args.object_store_mb < 80:
        raise ConfigError("--cpus must be ≥ 1 and --object-store-mb ≥ 80 (Ray's minimum object store)")
    from rollart.resources.loopback import LoopbackCluster

    tmp = Path(tempfile.mkdtemp(prefix="rollart-ray-", dir="/tmp"))  # short: Ray's socket paths live under it
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    cluster = LoopbackCluster(tmp, cpus=args.cpus, object_store_bytes=args.object_store_mb * 1_000_000)
    stopped_cleanly = False
    try:
        try:
            address = cluster.head(nodes[0])
        except RuntimeError as exc:
            print(f"rollart: {exc}", file=sys.stderr)
            return 1
        try:
            for resources in nodes[1:]:
                # one at a time: raylets registering with the head's GCS at once on a small machine time out
                # in Ray's own start-up ("Failed to get node info: Deadline Exceeded")
                cluster.wait_started()
                cluster.add(resources)
            cluster.wait_started()
        except RuntimeError as exc:
            print(f"rollart: {exc}", file=sys.stderr)
            return 1
        print(f"rollart: a {len(nodes)}-node Ray cluster on 127.0.0.1 (logs in {tmp}):", flush=True)
        for i, resources in enumerate(nodes):
            print(f"  {'head' if i == 0 else f'node {i}'}: {json.dumps(resources)}", flush=True)
        print(f"address {address} — join it with: rollart train RUN.yaml cluster.address={address}\n"
              "(Ctrl-C here stops every node)", flush=True)
        while not stop.wait(1.0):
            dead = [i for i, node in enumerate(cluster.nodes) if node.poll() is not None]
            if dead:
                log = tmp / f"node{dead[0]}.log"
                print(f"rollart: node {dead[0]} stopped on its own; its log ({log}) ends:\n"
                      f"{log.read_text()[-2000:] if log.is_file() else ''}", file=sys.stderr)
                return 1
        print("rollart: stopping the nodes", flush=True)
        stopped_cleanly = True
        return 0
    finally:
        cluster.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if stopped_cleanly:  # (after a failure its logs stay, for the message that named them)
            shutil.rmtree(tmp, ignore_errors=True)
