"""rollart.resources — the resource plane: pools, `@affinity`, the ResourceManager, placement of
`Cluster`s, and the Ray runtime (embedded or joined by address). See DESIGN.md §4 and the README section
"Pools, affinity and fallback".

Public API (imported lazily: `from rollart.resources import affinity` imports no Ray):
- `affinity(pool, fallback=[...], role=...)`, `affinity_of(cls)`, `role_of(cls)` — affinity.py
- `Runtime(cfg)` — context manager; `rt.resources` is a `Resources` — runtime.py
- `Resources.place(cls, role=, pool=, fallback=, replicas=, ...) -> Cluster`, `.snapshot()`, `.metrics()`
- `Cluster.call_all / call_one / gather / gather_async / shutdown` — cluster.py
- `Placement`, `PoolStatus`, `NodeShare` — ledger.py; `PlacementError`, `ClusterError` — errors.py
- `pool_resource(pool)`, `worker_name(role, pool, index)` — names.py
"""

from __future__ import annotations

import os
from typing import Any

# Before anything imports Ray (NOTES.md): loopback only, no token auth on loopback clusters, no usage
# stats. Ray reads the first at import time. setdefault: an operator's explicit choice wins.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

_LAZY = {
    "affinity": "rollart.resources.affinity",
    "affinity_of": "rollart.resources.affinity",
    "role_of": "rollart.resources.affinity",
    "Runtime": "rollart.resources.runtime",
    "Resources": "rollart.resources.placement",
    "Cluster": "rollart.resources.cluster",
    "Placement": "rollart.resources.ledger",
    "PoolStatus": "rollart.resources.ledger",
    "NodeShare": "rollart.resources.ledger",
    "PlacementError": "rollart.resources.errors",
    "ClusterError": "rollart.resources.errors",
    "ResourceError": "rollart.resources.errors",
    "pool_resource": "rollart.resources.names",
    "worker_name": "rollart.resources.names",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rollart.resources' has no attribute {name!r}")
