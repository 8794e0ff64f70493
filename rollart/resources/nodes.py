"""What a Ray cluster holds of each pool, from Ray's own tables (pure functions over plain dicts).

In: pool configs, `ray.cluster_resources()` totals and `ray.nodes()` entries. Out: per-pool capacity on
the cluster, the nodes that hold each pool, the pools the cluster lacks, and the `ray start` line that
would declare them. No Ray import, so all of it is unit-testable.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from rollart.config import PoolConfig
from rollart.resources.accounts import NodeShare
from rollart.resources.names import pool_resource


def cluster_capacity(pool: str, totals: Mapping[str, float]) -> float:
    """How much of `pool` the cluster holds (0 when no node declares it)."""
    return float(totals.get(pool_resource(pool), 0.0))


def pool_nodes(pools: Iterable[str], nodes: Iterable[Mapping[str, Any]]) -> dict[str, tuple[NodeShare, ...]]:
    """For each pool, the alive nodes that declare its resource and how much of it each holds."""
    alive = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    out: dict[str, tuple[NodeShare, ...]] = {}
    for pool in pools:
        key = pool_resource(pool)
        out[pool] = tuple(
            NodeShare(str(n["NodeID"]), str(n.get("NodeManagerAddress", "")), float(n["Resources"][key]))
            for n in alive
            if n.get("Resources", {}).get(key, 0) > 0
        )
    return out


def missing_pools(pools: Mapping[str, PoolConfig], totals: Mapping[str, float]) -> list[str]:
    """Declared pools of which the cluster holds nothing, in declaration order."""
    return [name for name in pools if cluster_capacity(name, totals) <= 0]


def declare_hint(pools: Mapping[str, PoolConfig], names: Iterable[str], address: str) -> str:
    """The `ray start` line that would add `names` (with their configured capacity) to a node."""
    resources = {pool_resource(n): pools[n].capacity for n in names}
    spec = json.dumps({k: (int(v) if float(v).is_integer() else v) for k, v in resources.items()})
    return f"ray start --address={address or '<head>:6379'} --resources='{spec}'"


def loopback_interface() -> str | None:
    """The name of the network interface holding 127.0.0.1 (`lo` on Linux, `lo0` on macOS): where collectives
    among processes of one node keep their sockets (gloo binds it, so nothing listens beyond loopback)."""
    import socket

    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
            return name
    return None
