"""Routing generation requests to inference workers: by domain's pool, sticky, least-loaded. Pure logic.

In: how many workers each pool's inference cluster starts with, which pool each task domain generates on
(`domains.<d>.pool`, the hardware-affinity mapping) and each pool's fallback pools (`pools.<p>.fallback`);
later, workers that leave (`remove`: dead) and join (`add`: a replacement, an elastic addition). Out: for
a request's (domain, trajectory id), the (pool, worker index) to send it to — or None when no pool it may
use has a worker; in-flight counts per worker.

Rules:
- A domain goes to the first pool of its chain — its own pool, then that pool's fallbacks — that has a
  worker, never elsewhere (an unknown domain is a ValueError). While its own pool has a worker, that is
  the only pool it uses.
- A trajectory seen before goes to the worker it went to before (its KV prefix is cached there) while that
  worker is alive — even if its domain was re-mapped since (`remap`: only new trajectories follow the new
  mapping) — unless it went there as a fallback and its domain's own pool has a worker again.
- A new trajectory goes to the worker of that pool with the fewest requests in flight; ties go to the
  worker that has been given the fewest trajectories, then the lowest index, so idle moments (all zero in
  flight, e.g. while envs step) still spread trajectories evenly.
- Worker keys are never reused: a worker that joins gets the next index of its pool.
- The sticky map is bounded (least recently routed trajectories are forgotten first).
- Lent pools (`lendable`: the trainer's devices, lent to generation while the trainer waits for a batch) take
  no request until `lend(pool)`; while lent, a new trajectory of any domain goes to the lent pool's least
  loaded worker if that worker has fewer requests in flight than the least loaded one of the domain's own
  pool. `reclaim(pool)` ends the loan: nothing more is routed there, and a trajectory that was there is
  routed anew at its next request (the proxy continues its interrupted turn elsewhere).

Cost: routing a new trajectory is O(log workers) — each pool keeps a heap of (in flight, assigned, index)
entries, each alive worker with at least one entry no greater than its current one: a count that falls files
a new entry, one that rises (a request started, a trajectory assigned) files nothing, and an entry found
out of date at the top is re-filed or dropped (a removed worker's); the heap is rebuilt when stale entries
pile up — so a 1,000-GPU cluster (the cluster twin runs this class unchanged) routes as fast as a laptop's
two workers.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Mapping, Sequence

WorkerKey = tuple[str, int]  # (pool, index within that pool's cluster, in order of joining)


class Router:
    def __init__(
        self,
        pool_sizes: Mapping[str, int],
        domain_pools: Mapping[str, str],
        max_sticky: int = 65536,
        pool_fallbacks: Mapping[str, Sequence[str]] | None = None,
        lendable: Sequence[str] = (),
    ):
        for domain, pool in domain_pools.items():
            if pool_sizes.get(pool, 0) < 1:
                have = {p: n for p, n in pool_sizes.items() if n}
                raise ValueError(
                    f"domain {domain!r} generates on pool {pool!r}, which has no inference workers "
                    f"(workers per pool: {have}); give that pool workers or set domains.{domain}.pool"
                )
        self.domain_pools = dict(domain_pools)
        self.lendable = frozenset(lendable)  # pools routed to only while lent
        self._lent: set[str] = set()
        self.pool_fallbacks = {p: tuple(f) for p, f in (pool_fallbacks or {}).items()}
        self._max_sticky = max_sticky
        self._sticky: OrderedDict[str, WorkerKey] = OrderedDict()
        self._next_index = {p: n for p, n in pool_sizes.items() if n > 0}
        self._in_flight: dict[WorkerKey, int] = {(p, i): 0 for p, n in self._next_index.items() for i in range(n)}
        self._assigned: dict[WorkerKey, int] = dict.fromkeys(self._in_flight, 0)
        self._alive: dict[str, set[int]] = {p: set(range(n)) for p, n in self._next_index.items()}
        self._heaps: dict[str, list[tuple[int, int, int]]] = {}
        for pool in self._alive:
            self._rebuild(pool)

    def route(self, domain: str, trajectory_id: str) -> WorkerKey | None:
        """The worker for this request, or None when no pool of the domain's chain has a worker."""
        target = self._target_pool(domain)
        if target is None:
            return None
        key = self._sticky.get(trajectory_id)
        if key is not None and key in self._in_flight and (
                key[0] in self._lent or (key[0] not in self.lendable
                                         and (key[0] == target or not self._on_fallback(domain, key)))):
            self._sticky.move_to_end(trajectory_id)
            return key
        key = self._least_loaded(target)
        for pool in self._lent:
            if self._alive.get(pool):
                lent = self._least_loaded(pool)
                if self._in_flight[lent] < self._in_flight[key]:
                    key = lent
        self._assigned[key] += 1  # (a rise: its heap entry stays a lower bound)
        self._sticky[trajectory_id] = key
        self._sticky.move_to_end(trajectory_id)
        while len(self._sticky) > self._max_sticky:
            self._sticky.popitem(last=False)
        return key

    def can_route(self, domain: str) -> bool:
        """Whether some pool of the domain's chain has a worker now."""
        return self._target_pool(domain) is not None

    def _target_pool(self, domain: str) -> str | None:
        pool = self.domain_pools.get(domain)
        if pool is None:
            raise ValueError(
                f"request domain {domain!r} is not a configured domain (known: {sorted(self.domain_pools)})"
            )
        if self._alive.get(pool):  # (the common case: its own pool has workers)
            return pool
        return next((p for p in self.pool_fallbacks.get(pool, ()) if self._alive.get(p)), None)

    def lend(self, pool: str) -> None:
        """A lendable pool takes requests from now on (see the module docstring)."""
        if pool not in self.lendable:
            raise ValueError(f"pool {pool!r} is not lendable (lendable: {sorted(self.lendable)})")
        self._lent.add(pool)

    def reclaim(self, pool: str) -> None:
        """A lent pool takes no new request from now on; its trajectories are routed anew at their next one."""
        self._lent.discard(pool)

    def lent(self) -> set[str]:
        return set(self._lent)

    def workers(self, pool: str) -> list[WorkerKey]:
        """The alive workers of `pool`, in index order."""
        return [(pool, i) for i in sorted(self._alive.get(pool, ()))]

    def add(self, pool: str) -> WorkerKey:
        """A worker joins `pool`: its key (the pool's next index)."""
        key = (pool, self._next_index.get(pool, 0))
        self._next_index[pool] = key[1] + 1
        self._in_flight[key] = 0
        self._assigned[key] = 0
        self._alive.setdefault(pool, set()).add(key[1])
        self._push(key)
        return key

    def remove(self, key: WorkerKey) -> None:
        """A worker leaves (it died): no request goes to it again; its trajectories are routed anew."""
        self._in_flight.pop(key, None)
        self._assigned.pop(key, None)
        self._alive.get(key[0], set()).discard(key[1])  # its heap entries are skipped from now on
        for trajectory_id in [t for t, k in self._sticky.items() if k == key]:
            del self._sticky[trajectory_id]

    def _on_fallback(self, domain: str, key: WorkerKey) -> bool:
        return key[0] in self.pool_fallbacks.get(self.domain_pools[domain], ())

    def remap(self, domain_pools: Mapping[str, str]) -> None:
        """New trajectories of these domains go to these pools from now on; trajectories already routed
        stay where they are (the online re-mapping, at a weight sync)."""
        for domain, pool in domain_pools.items():
            if not self._alive.get(pool):
                raise ValueError(f"remap: domain {domain!r} to pool {pool!r}, which has no inference workers "
                                 f"(pools with workers: {sorted(p for p, alive in self._alive.items() if alive)})")
        self.domain_pools.update(domain_pools)

    def worker_of(self, trajectory_id: str) -> WorkerKey | None:
        return self._sticky.get(trajectory_id)

    def forget(self, trajectory_id: str) -> None:
        self._sticky.pop(trajectory_id, None)

    def started(self, key: WorkerKey) -> None:
        if key in self._in_flight:
            self._in_flight[key] += 1  # (a rise: its heap entry stays a lower bound)

    def finished(self, key: WorkerKey) -> None:
        if key in self._in_flight:  # a removed worker's requests end without a count to give back
            self._in_flight[key] -= 1
            self._push(key)

    # --- the per-pool heap: min (in flight, assigned, index) over lower bounds -------------------------
    def _entry(self, key: WorkerKey) -> tuple[int, int, int]:
        return (self._in_flight[key], self._assigned[key], key[1])

    def _least_loaded(self, pool: str) -> WorkerKey:
        """The pool's alive worker with the least (in flight, assigned, index); the pool has one."""
        heap = self._heaps[pool]
        while True:
            top = heap[0]
            key = (pool, top[2])
            if key in self._in_flight:
                entry = self._entry(key)
                if top == entry:  # exact, and no worker's current entry is below it
                    return key
                if top < entry:  # the worker got busier since: file its current entry instead
                    heapq.heapreplace(heap, entry)
                    continue
            heapq.heappop(heap)  # a removed worker's, or a worker's older, higher entry

    def _push(self, key: WorkerKey) -> None:
        heap = self._heaps.setdefault(key[0], [])
        heapq.heappush(heap, self._entry(key))
        if len(heap) > 4 * len(self._alive[key[0]]) + 64:  # mostly stale entries: start afresh
            self._rebuild(key[0])

    def _rebuild(self, pool: str) -> None:
        self._heaps[pool] = [self._entry((pool, i)) for i in self._alive[pool]]
        heapq.heapify(self._heaps[pool])

    def in_flight(self) -> dict[WorkerKey, int]:
        return dict(self._in_flight)

    def assigned(self) -> dict[WorkerKey, int]:
        return dict(self._assigned)
