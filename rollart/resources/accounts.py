"""Pool accounting, as plain Python: capacity, who holds what, and which fallbacks were taken.

In: pool specs (name, kind, device, capacity, fallback) and reservation requests (a role, an ordered chain
of pools, a number of slots). Out: a `Placement` (the pool chosen and the worker's name) or a `NoRoom`
that names every pool tried with its free capacity; snapshots per pool; flat metrics.

Guarantees:
- A reservation takes the first pool of the chain with `free >= slots`; free never goes below zero.
- Worker names are `<role>/<pool>/<index>` with the smallest index not in use for that role and pool, so
  they are unique among live workers.
- Every reservation that lands on a pool other than the chain's first is counted (cumulatively, never
  decremented on release): a fallback is never silent.
- Worker deaths and their replacements are counted per pool (the pool the dead worker was on), also
  cumulatively. A pool's capacity follows the alive Ray nodes (`set_capacity`): when a node leaves, free
  room shrinks (never below zero) and a replacement falls back; when one joins, room grows.

The `ResourceManager` Ray actor (manager.py) holds one `PoolAccounts`; keeping the logic here makes it testable
without Ray. Its methods run one at a time in the actor, so reserve is atomic.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from rollart.resources.names import worker_name

_EPS = 1e-9  # slots are floats; compare with a little slack so 0.1 + 0.2 fits in 0.3


@dataclass(frozen=True)
class PoolSpec:
    """A pool as the accounts know it; `capacity` is what Ray holds of its custom resource."""

    name: str
    kind: str
    device: str
    capacity: float
    fallback: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """Where one worker runs: its name, role, pool (and the pool it preferred), slots, device, node."""

    worker: str
    role: str
    pool: str
    index: int
    preferred: str
    slots: float
    device: str
    node_id: str = ""  # the Ray node, once Ray has reserved the slot

    @property
    def fell_back(self) -> bool:
        return self.pool != self.preferred


@dataclass(frozen=True)
class PoolRoom:
    pool: str
    free: float
    capacity: float

    def __str__(self) -> str:
        if self.capacity <= 0:
            return f"{self.pool}: no capacity on this cluster"
        return f"{self.pool}: {self.free:g} of {self.capacity:g} free"


@dataclass(frozen=True)
class NoRoom:
    """No pool of the chain could take the worker; `tried` lists each with its free capacity."""

    worker: str  # the name it would have had on its preferred pool
    role: str
    slots: float
    tried: tuple[PoolRoom, ...]

    def message(self) -> str:
        tried = "; ".join(str(r) for r in self.tried)
        return (
            f"cannot place worker {self.worker} (role '{self.role}', {self.slots:g} slot"
            f"{'s' if self.slots != 1 else ''}): no pool it may use has room — {tried}. "
            f"Stop workers on these pools, raise pools.<name>.capacity, or add a fallback pool with room "
            f"(pools.<name>.fallback or roles.{self.role}.fallback)."
        )


@dataclass(frozen=True)
class NodeShare:
    """How much of a pool's resource one Ray node holds."""

    node_id: str
    address: str
    amount: float


@dataclass(frozen=True)
class PoolStatus:
    """One pool in a snapshot. `fallbacks_out`: workers that preferred this pool but went elsewhere;
    `fallbacks_in`: workers placed here that preferred another pool."""

    name: str
    kind: str
    device: str
    capacity: float
    free: float
    fallback: tuple[str, ...]
    holders: tuple[Placement, ...]
    fallbacks_in: int
    fallbacks_out: int
    nodes: tuple[NodeShare, ...] = ()
    worker_deaths: int = 0
    replacements: int = 0


class PoolAccounts:
    def __init__(self) -> None:
        self._pools: dict[str, PoolSpec] = {}
        self._held: dict[str, Placement] = {}
        self._fallbacks: Counter[tuple[str, str]] = Counter()  # (preferred, used) → count
        self._deaths: Counter[str] = Counter()  # pool → workers of it that died
        self._replacements: Counter[str] = Counter()  # pool → dead workers of it replaced

    def add_pools(self, specs: Iterable[PoolSpec]) -> None:
        """Declare pools, or update a known pool's spec; holders and counters are kept."""
        for spec in specs:
            self._pools[spec.name] = spec

    def set_capacity(self, capacities: dict[str, float]) -> list[str]:
        """Follow what the alive Ray nodes hold of each known pool; returns the pools whose capacity changed."""
        changed = []
        for name, capacity in capacities.items():
            spec = self._pools.get(name)
            if spec is not None and abs(spec.capacity - capacity) > _EPS:
                self._pools[name] = replace(spec, capacity=capacity)
                changed.append(name)
        return changed

    def record_death(self, worker: str) -> None:
        """Count a held worker's death against its pool (its slot stays held until `release`)."""
        placed = self._held.get(worker)
        if placed is not None:
            self._deaths[placed.pool] += 1

    def record_replacement(self, pool: str) -> None:
        """Count one dead worker of `pool` replaced (wherever the replacement was placed)."""
        self._replacements[pool] += 1

    def free(self, pool: str) -> float:
        spec = self._pools.get(pool)
        if spec is None:
            return 0.0
        used = sum(p.slots for p in self._held.values() if p.pool == pool)
        return max(0.0, spec.capacity - used)

    def reserve(self, role: str, chain: Sequence[str], slots: float) -> Placement | NoRoom:
        if not chain:
            raise ValueError(f"role '{role}': an empty pool chain (give a pool)")
        if slots <= 0:
            raise ValueError(f"role '{role}': slots must be > 0, got {slots}")
        for pool in chain:
            if self.free(pool) + _EPS >= slots:
                spec = self._pools[pool]
                index = self._next_index(role, pool)
                placed = Placement(
                    worker=worker_name(role, pool, index),
                    role=role,
                    pool=pool,
                    index=index,
                    preferred=chain[0],
                    slots=slots,
                    device=spec.device,
                )
                self._held[placed.worker] = placed
                if placed.fell_back:
                    self._fallbacks[(placed.preferred, pool)] += 1
                return placed
        tried = tuple(
            PoolRoom(p, self.free(p), self._pools[p].capacity if p in self._pools else 0.0) for p in chain
        )
        return NoRoom(worker_name(role, chain[0], self._next_index(role, chain[0])), role, slots, tried)

    def confirm(self, worker: str, node_id: str) -> None:
        """Record the Ray node that holds a reserved worker's slot."""
        if worker in self._held:
            self._held[worker] = replace(self._held[worker], node_id=node_id)

    def release(self, workers: Iterable[str]) -> None:
        for worker in workers:
            self._held.pop(worker, None)

    def snapshot(self) -> tuple[PoolStatus, ...]:
        out = []
        for name, spec in self._pools.items():
            out.append(
                PoolStatus(
                    name=name,
                    kind=spec.kind,
                    device=spec.device,
                    capacity=spec.capacity,
                    free=self.free(name),
                    fallback=spec.fallback,
                    holders=tuple(p for p in self._held.values() if p.pool == name),
                    fallbacks_in=sum(n for (pref, used), n in self._fallbacks.items() if used == name),
                    fallbacks_out=sum(n for (pref, used), n in self._fallbacks.items() if pref == name),
                    worker_deaths=self._deaths[name],
                    replacements=self._replacements[name],
                )
            )
        return tuple(out)

    def _next_index(self, role: str, pool: str) -> int:
        taken = {p.index for p in self._held.values() if p.role == role and p.pool == pool}
        return next(i for i in range(len(taken) + 1) if i not in taken)


def pool_metrics(statuses: Iterable[PoolStatus]) -> dict[str, float]:
    """Flat metrics for the observability plane: `pools/<pool>/{capacity,free,held,workers,
    fallbacks_in,fallbacks_out,worker_deaths,replacements}` and `pools/fallbacks` (total fallbacks taken)."""
    out: dict[str, float] = {}
    total = 0
    for s in statuses:
        out[f"pools/{s.name}/capacity"] = s.capacity
        out[f"pools/{s.name}/free"] = s.free
        out[f"pools/{s.name}/held"] = s.capacity - s.free
        out[f"pools/{s.name}/workers"] = float(len(s.holders))
        out[f"pools/{s.name}/fallbacks_in"] = float(s.fallbacks_in)
        out[f"pools/{s.name}/fallbacks_out"] = float(s.fallbacks_out)
        out[f"pools/{s.name}/worker_deaths"] = float(s.worker_deaths)
        out[f"pools/{s.name}/replacements"] = float(s.replacements)
        total += s.fallbacks_in
    out["pools/fallbacks"] = float(total)
    return out
