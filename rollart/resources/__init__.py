"""rollart.resources — the resource plane: pools, `@affinity`, the ResourceManager, placement of
`WorkerSet`s, and the Ray runtime (embedded or joined by address). See docs/architecture.md §3 and docs/cluster.md
(pools, affinity and fallback).

Public API (`from rollart.resources import affinity` imports no Ray; Runtime/Resources/WorkerSet load Ray
when first used):
- `affinity(pool, fallback=[...], role=...)`, `affinity_of(cls)`, `role_of(cls)` — affinity.py
- `Runtime(cfg)` — context manager; `rt.resources` is a `Resources` — runtime.py
- `Resources.place(cls, role=, pool=, fallback=, replicas=, ...) -> WorkerSet`, `.snapshot()`, `.metrics()`
- `WorkerSet.call_all / call_one / gather / shutdown` — worker_set.py
- `Placement`, `PoolStatus`, `NodeShare` — accounts.py; `PlacementError`, `ClusterError` — errors.py
- `pool_resource(pool)`, `worker_name(role, pool, index)` — names.py
"""

from __future__ import annotations

import os
from typing import Any

# Before anything imports Ray: loopback only (otherwise Ray binds every interface), no token auth on loopback
# clusters (with it an explicit 127.0.0.1:PORT address fails; runtime.py turns it on for a non-loopback
# cluster.address), no usage stats. Ray reads the first at import time. setdefault: an operator's explicit
# choice wins.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# whether rollart (not the operator) turned token auth off: joining a non-loopback cluster turns it back on
AUTH_MODE_DEFAULTED = "RAY_AUTH_MODE" not in os.environ
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Serve's proxy asks each replica for its queue length within 0.1 s by default; on a busy 2-core machine
# replicas often answer later, which floods the log with warnings (routing still works). Workers inherit
# this from the environment Ray starts with.
os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")

# Ray-free parts are imported eagerly (this also makes `rollart.resources.affinity` the decorator, not the
# submodule of the same name); the parts that import Ray load on first use.
from rollart.resources.affinity import affinity, affinity_of, role_of  # noqa: E402
from rollart.resources.errors import ClusterError, PlacementError, ResourceError  # noqa: E402
from rollart.resources.accounts import NodeShare, Placement, PoolStatus  # noqa: E402
from rollart.resources.names import pool_resource, worker_name  # noqa: E402

__all__ = [
    "affinity", "affinity_of", "role_of", "ClusterError", "PlacementError", "ResourceError", "NodeShare",
    "Placement", "PoolStatus", "pool_resource", "worker_name", "Runtime", "Resources", "WorkerSet",
]

_LAZY = {
    "Runtime": "rollart.resources.runtime",
    "Resources": "rollart.resources.placement",
    "WorkerSet": "rollart.resources.worker_set",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rollart.resources' has no attribute {name!r}")
