"""`ProxyShards`: the LLM proxy as N `LLMProxy` actors (`inference.proxy_shards`), seen by the driver as one.

In: the shards' actor handles, in shard order. Out: `clients` — what env workers generate through (the one
handle, or the list of shards, which they wrap in a `rollart.envs.ShardedLLMClient` that sends each
trajectory's turns and aborts to the shard `rollart.base.proxy_shard` picks for its group); the driver's calls
on every shard — `suspend`, `resume`, `update_weights`, `remap`, `stats` (merged) and `each` for the
membership events the resource plane reports (`remove_worker`, `add_worker`).

Why every shard sees every engine (and not a partition of them): a pool may hold fewer engines than there
are shards, a domain's fallback pools and an engine's failover must stay reachable from every trajectory, and
least-loaded placement works on whatever engines a shard has. What one shard cannot see is the others'
load: each places its new trajectories on the engines least loaded by its own requests, and as the shards'
traffic is even (by group hash) the sum stays level. The cost split is the point: each shard's process
handles only its groups' turns, so the CPU per turn stays that of one proxy at a shard's share of the load.
Lending the trainer's devices (`lend`/`reclaim`/`rebalance`) is not fanned out: it levels turns across every
engine, which one shard does not see, so config validation refuses it beside shards (the twin, which lends,
runs one proxy and models the shards' CPU: `rollart.sim.control`).

Guarantees: suspend/resume and weight updates reach every shard before they return (a turn admitted on any
shard after `resume` runs on the new version); an engine swaps once per version (its own lock: the first
shard's call swaps, the others find the version served), and the timings merged per engine are the swap's;
membership events reach every shard (each drops a dead engine, each makes a new one pull the served version
before routing to it); counters are summed over shards, except membership counts (every shard saw the same
death or join), and `routed_by_shard` says where the turns went.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

_TRAFFIC = ("waiting_admission", "routed", "turn_retries", "preempted_turns", "preempted_tokens")
_MEMBERSHIP = ("workers_lost", "workers_joined")  # each shard counts the same engine deaths and joins
_BY_WORKER = ("in_flight", "trajectories_assigned")


class ProxyShards:
    def __init__(self, handles: Sequence[Any]) -> None:
        if not handles:
            raise ValueError("ProxyShards needs at least one LLMProxy actor")
        self.handles = list(handles)

    @property
    def clients(self) -> Any:
        """What env workers generate through: the one proxy's handle, or every shard's (in shard order)."""
        return self.handles[0] if len(self.handles) == 1 else list(self.handles)

    def each(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`method(*args, **kwargs)` called on every shard: the Ray object refs, in shard order."""
        return [getattr(handle, method).remote(*args, **kwargs) for handle in self.handles]

    async def _all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return list(await asyncio.gather(*self.each(method, *args, **kwargs)))

    async def suspend(self) -> None:
        await self._all("suspend")

    async def resume(self) -> None:
        await self._all("resume")

    async def remap(self, domain_pools: Mapping[str, str]) -> None:
        await self._all("remap", dict(domain_pools))

    async def update_weights(self, version: int) -> dict[str, dict[str, float]]:
        """Every engine serves `version`; per engine, its swap's timings (the largest any shard saw)."""
        merged: dict[str, dict[str, float]] = {}
        for timings in await self._all("update_weights", version):
            for name, figures in timings.items():
                mine = merged.setdefault(name, {})
                for key, value in figures.items():
                    mine[key] = max(mine.get(key, value), value)
        return merged

    async def stats(self, workers: bool = False) -> dict[str, Any]:
        """The shards' counters merged (see the module doc); with `workers=True` each engine's own `stats()`,
        asked of the first shard only (every shard sees the same engines)."""
        refs = [handle.stats.remote(workers=workers and shard == 0) for shard, handle in enumerate(self.handles)]
        return merge_stats(list(await asyncio.gather(*refs)))


def merge_stats(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """One `LLMProxy.stats()` from every shard's (see the module doc for what is summed)."""
    out: dict[str, Any] = {
        "suspended": any(s["suspended"] for s in shards),
        **{key: sum(s[key] for s in shards) for key in _TRAFFIC},
        **{key: max(s[key] for s in shards) for key in _MEMBERSHIP},
        **{key: _summed([s[key] for s in shards]) for key in _BY_WORKER},
        "routed_by_domain": {domain: _summed([s["routed_by_domain"].get(domain, {}) for s in shards])
                             for domain in sorted({d for s in shards for d in s["routed_by_domain"]})},
        "routed_by_shard": [s["routed"] for s in shards],
    }
    if "workers" in shards[0]:
        out["workers"] = shards[0]["workers"]
    return out


def _summed(counts: list[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for mapping in counts:
        for key, n in mapping.items():
            out[key] = out.get(key, 0) + n
    return out
