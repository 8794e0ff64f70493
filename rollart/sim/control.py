"""The control plane's own CPU, as the twin models it: each LLM-proxy shard is one process, a single server.

In: the hardware file's `control` section (`ControlPlaneSpec`: `us_per_turn`, `shards`, `shard_by`) and the
production `LLMProxy` that the env runner generates through. Out: `ShardedProxyCost`, an `LLMClient` whose
`generate` first holds its shard's CPU for `us_per_turn` of virtual time — first come, first served behind
the turns already queued at that shard — and then asks the proxy; `stats()` per shard: turns, busy share
(utilisation) and the mean wait in its queue.

Why: every generation turn of a real run passes through the LLM proxy — a Ray actor, one process: the env
worker's call in, the routing, the call to the engine and both answers back. One process serves at most
10⁶ / `us_per_turn` turns a second, whatever the GPUs could do; the twin's engines do not feel that limit
unless it is modelled. With `shards` > 1 the turns are split over that many proxy processes, by task domain
(a shard per domain, in sorted order, modulo the shards) or by group (`rollart.base.proxy_shard`, the choice a
real run's `inference.proxy_shards` makes — every member of a group on one shard, the shards evenly loaded). Queueing
makes the ceiling visible before it is reached: at utilisation ρ the mean wait of this M/D/1 server is
ρ·s / (2(1 − ρ)), and past ρ = 1 the queue, and the step, grow without bound.

`us_per_turn` = 0 (the default) models no cost at all and wraps nothing: every figure the twin produced
before this module existed is unchanged. Routing, sticky placement and weights stay the one production
proxy's — only the CPU is split, which is what a sharded proxy changes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

from rollart.base.proxy_shard import proxy_shard
from rollart.sim.hardware import ControlPlaneSpec
from rollart.types import GenerationRequest, GenerationResult, LLMClient


@dataclass
class _Shard:
    free_at: float = 0.0  # virtual time its CPU is free (every queued turn served)
    turns: int = 0
    busy_s: float = 0.0
    wait_s: float = 0.0


class ShardedProxyCost:
    """`LLMClient` over the production proxy with each turn's control-plane CPU queued at its shard."""

    def __init__(self, spec: ControlPlaneSpec, proxy: LLMClient, domains: Sequence[str]) -> None:
        self.spec, self.proxy = spec, proxy
        self.cost_s = spec.us_per_turn * 1e-6
        self._shards = [_Shard() for _ in range(spec.shards)]
        self._domain_shard = {d: i % spec.shards for i, d in enumerate(sorted(domains))}

    def shard_of(self, request: GenerationRequest) -> int:
        if self.spec.shard_by == "domain":
            return self._domain_shard[request.domain]
        return proxy_shard(request.trajectory_id, len(self._shards))

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        shard = self._shards[self.shard_of(request)]
        now = asyncio.get_running_loop().time()
        start = max(now, shard.free_at)
        shard.free_at = start + self.cost_s
        shard.turns += 1
        shard.busy_s += self.cost_s
        shard.wait_s += start - now
        await asyncio.sleep(shard.free_at - now)
        return await self.proxy.generate(request)

    async def abort(self, trajectory_id: str) -> None:
        await self.proxy.abort(trajectory_id)

    def stats(self, now: float) -> dict[str, Any]:
        """Per shard: turns, utilisation over `now` seconds, mean queue wait per turn (µs); and the worst."""
        rows = [{"turns": s.turns, "utilisation": s.busy_s / now if now > 0 else 0.0,
                 "mean_wait_us": s.wait_s / s.turns * 1e6 if s.turns else 0.0} for s in self._shards]
        turns = sum(s.turns for s in self._shards)
        return {"shards": rows, "max_utilisation": max(r["utilisation"] for r in rows),
                "mean_control_us_per_turn": (sum(s.wait_s + s.busy_s for s in self._shards) / turns * 1e6
                                             if turns else 0.0)}
