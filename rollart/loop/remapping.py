"""Online re-mapping (`rollout.remap`): a domain whose workload drifted is generated on another pool.

In: the run config (`rollout.remap`, `remap_drift`, `remap_min_episodes`, each domain's pool), the
`DomainProfiler` the run feeds (a real run: every trained trajectory; the twin: every turn), what each
domain's mapping was made for (its declared profile, or None: what it first measured), a `propose`
function and a `reroute` function. Out: `at_sync(version)`, called by the system after every weight sync
(steps 2–5), returns the re-mapping it made, if any: the confirmed drift (`DriftWatch`), the proposed
mapping for the measured profiles, the domains it moves; with `remap=auto` they are re-routed (`reroute`:
the LLM proxy's `remap`) — their new trajectories go to the new pool, those in flight finish where they
are. `propose` alone differs between a real run and the twin:

- `rollart train`: `nearest_workload` — each drifted domain goes to the pool of the domain whose planned
  workload its measured one is nearest to (the drift measure itself), so a domain that turned prefill-heavy
  joins the pool the run file gave its prefill-heavy domains; it stays when no other domain is nearer than
  its own plan. No hardware model is needed, so it works on any pools, CPU ones included.
- the twin (`rollart sim`): the analytic estimate's best mapping on the simulated hardware, or the
  re-mapper it is given (`rollart.sim.system`).
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Mapping

from rollart.config import DomainProfileConfig, RunConfig
from rollart.observability.profile import DomainProfiler, DriftWatch

log = logging.getLogger("rollart")

# (measured profile per domain, confirmed drift per domain) → the pool each domain should generate on
Propose = Callable[[Mapping[str, DomainProfileConfig], Mapping[str, float]], Awaitable[Mapping[str, str]]]


class Remapper:
    def __init__(self, cfg: RunConfig, profiler: DomainProfiler, planned: Mapping[str, DomainProfileConfig | None],
                 reroute: Callable[[dict[str, str]], Awaitable[None]], propose: Propose | None = None) -> None:
        """`propose`: None — a real run's `nearest_workload`."""
        rollout = cfg.rollout
        self.mode = rollout.remap
        self.profiler, self.reroute = profiler, reroute
        self.propose = propose or self._nearest_workload
        self.watch = DriftWatch(planned, rollout.remap_drift, rollout.remap_min_episodes)
        self.domain_pools = {d: dc.pool for d, dc in cfg.domains.items()}  # where new trajectories go now
        self.remaps: list[dict[str, Any]] = []

    async def at_sync(self, version: int) -> dict[str, Any] | None:
        """After the weight sync to `version`: re-map the domains whose drift is confirmed now, if any."""
        if self.mode == "none":
            return None
        drifted = self.watch.confirmed(self.profiler)
        if not drifted:
            return None
        measured = {d: self.profiler.measured(d, p or DomainProfileConfig()) for d, p in self.watch.planned.items()}
        proposal = await self.propose(measured, drifted)
        moved = {d: p for d, p in proposal.items() if self.domain_pools[d] != p}
        remap = {"version": version, "drift": dict(drifted), "moved": moved, "applied": self.mode == "auto"}
        self.remaps.append(remap)
        log.info("profile drift %s at version %d: the re-mapping moves %s%s", drifted, version, moved or "nothing",
                 "" if self.mode == "auto" else " (proposed only: rollout.remap=propose)")
        if self.mode == "auto" and moved:
            await self.reroute(moved)
            self.domain_pools.update(moved)
        self.watch.replan({d: measured[d] for d in drifted})
        return remap

    async def _nearest_workload(self, measured: Mapping[str, DomainProfileConfig],
                                drifted: Mapping[str, float]) -> dict[str, str]:
        return nearest_workload(self.profiler, self.watch.planned, self.domain_pools, drifted)


def nearest_workload(profiler: DomainProfiler, planned: Mapping[str, DomainProfileConfig | None],
                     domain_pools: Mapping[str, str], drifted: Mapping[str, float]) -> dict[str, str]:
    """Each drifted domain → the pool of the domain whose planned profile its measured one is nearest (the
    same measure as the drift; ties by name); its own pool when no other domain's is nearer than its plan."""
    out = {}
    for domain, own in drifted.items():
        distance = {other: profiler.drift(domain, profile) for other, profile in planned.items()
                    if other != domain and profile is not None}
        nearest = min(distance, key=lambda other: (distance[other], other), default=None)
        out[domain] = domain_pools[nearest] if nearest is not None and distance[nearest] < own else domain_pools[domain]
    return out
