"""Routing generation requests to inference workers: by domain's pool, sticky, least-loaded. Pure logic.

In: how many workers each pool's inference cluster has, and which pool each task domain generates on
(`domains.<d>.pool`, the hardware-affinity mapping). Out: for a request's (domain, trajectory id), the
(pool, worker index) to send it to; in-flight counts per worker.

Rules:
- A domain goes to the cluster of its pool, never elsewhere (an unknown domain is a ValueError).
- A trajectory seen before goes to the worker it went to before (its KV prefix is cached there).
- A new trajectory goes to the worker of that cluster with the fewest requests in flight; ties go to
  the worker that has been given the fewest trajectories, then the lowest index, so idle moments (all
  zero in flight, e.g. while envs step) still spread trajectories evenly.
- The sticky map is bounded (least recently routed trajectories are forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping

WorkerKey = tuple[str, int]  # (pool, index within that pool's cluster)


class Router:
    def __init__(self, pool_sizes: Mapping[str, int], domain_pools: Mapping[str, str], max_sticky: int = 65536):
        for domain, pool in domain_pools.items():
            if pool_sizes.get(pool, 0) < 1:
                have = {p: n for p, n in pool_sizes.items() if n}
                raise ValueError(
                    f"domain {domain!r} generates on pool {pool!r}, which has no inference workers "
                    f"(workers per pool: {have}); give that pool workers or set domains.{domain}.pool"
                )
        self.domain_pools = dict(domain_pools)
        self.pool_sizes = {p: n for p, n in pool_sizes.items() if n > 0}
        self._max_sticky = max_sticky
        self._sticky: OrderedDict[str, WorkerKey] = OrderedDict()
        self._in_flight: dict[WorkerKey, int] = {(p, i): 0 for p, n in self.pool_sizes.items() for i in range(n)}
        self._assigned: dict[WorkerKey, int] = dict.fromkeys(self._in_flight, 0)

    def route(self, domain: str, trajectory_id: str) -> WorkerKey:
        pool = self.domain_pools.get(domain)
        if pool is None:
            raise ValueError(f"request domain {domain!r} is not a configured domain (known: {sorted(self.domain_pools)})")
        key = self._sticky.get(trajectory_id)
        if key is not None and key[0] == pool:
            self._sticky.move_to_end(trajectory_id)
            return key
        key = min(
            ((pool, i) for i in range(self.pool_sizes[pool])),
            key=lambda k: (self._in_flight[k], self._assigned[k], k[1]),
        )
        self._assigned[key] += 1
        self._sticky[trajectory_id] = key
        while len(self._sticky) > self._max_sticky:
            self._sticky.popitem(last=False)
        return key

    def worker_of(self, trajectory_id: str) -> WorkerKey | None:
        return self._sticky.get(trajectory_id)

    def forget(self, trajectory_id: str) -> None:
        self._sticky.pop(trajectory_id, None)

    def started(self, key: WorkerKey) -> None:
        self._in_flight[key] += 1

    def finished(self, key: WorkerKey) -> None:
        self._in_flight[key] -= 1

    def in_flight(self) -> dict[WorkerKey, int]:
        return dict(self._in_flight)

    def assigned(self) -> dict[WorkerKey, int]:
        return dict(self._assigned)
