"""The ResourceManager: a named Ray actor holding the run's pool accounts (Ray's GCS is its store).

In: pool specs (registered by whoever connects first, updated by later connections), reservations and
releases from the placement code. Out: placements, `NoRoom` refusals and snapshots (see accounts.py).

Guarantees: one manager per name and Ray namespace, shared by every driver that connects under that name
(`rollart pools` joining a live run's cluster sees that run's holders); the one that created it owns it and
ends it when it is done (`Resources.end_manager`, called by `Runtime.shutdown`) rather than leaving that to
Ray's reference counting — a process that ran a job before (tests, notebooks) may still hold the previous
run's handles in garbage not yet collected, and a lookup by name could then hand the next run a manager that
the old handles' collection ends mid-run (Ray issue 44083: a full test run lost its fault-injection run that
way). Its methods run one at a time, so reservations are atomic; it asks Ray for no CPU (it must never wait
for a core on a loaded machine); it is not detached, so it goes away with its owner if that dies; it lives on
the driver's node (`on_driver_node`), so losing another node never takes the run's pool accounts.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rollart.resources.accounts import PoolAccounts, NoRoom, Placement, PoolSpec, PoolStatus

MANAGER_NAME = "rollart_resource_manager"


@ray.remote(num_cpus=0, max_concurrency=1)
class ResourceManager:
    def __init__(self) -> None:
        self._accounts = PoolAccounts()

    def add_pools(self, specs: list[PoolSpec]) -> None:
        self._accounts.add_pools(specs)

    def reserve(self, role: str, chain: Sequence[str], slots: float) -> Placement | NoRoom:
        return self._accounts.reserve(role, chain, slots)

    def confirm(self, worker: str, node_id: str) -> None:
        self._accounts.confirm(worker, node_id)

    def release(self, workers: Iterable[str]) -> None:
        self._accounts.release(workers)

    def snapshot(self) -> tuple[PoolStatus, ...]:
        return self._accounts.snapshot()

    def set_capacity(self, capacities: dict[str, float]) -> list[str]:
        return self._accounts.set_capacity(capacities)

    def record_death(self, worker: str) -> None:
        self._accounts.record_death(worker)

    def record_replacement(self, pool: str) -> None:
        self._accounts.record_replacement(pool)

    def free(self, pool: str) -> float:
        return self._accounts.free(pool)


def on_driver_node() -> NodeAffinitySchedulingStrategy:
    """Where the run's control actors go: the driver's own node. A zero-CPU actor may otherwise land on any
    node, and one on a worker node would die with it — taking the run with it, though the driver lives."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def connect_manager(name: str = MANAGER_NAME) -> tuple[ray.actor.ActorHandle, bool]:
    """The live ResourceManager named `name` in this Ray namespace, or a new one (on the driver's node);
    True when this call created it (its caller owns it)."""
    try:
        return ray.get_actor(name), False
    except ValueError:  # no such actor: create it
        pass
    try:
        return ResourceManager.options(name=name, scheduling_strategy=on_driver_node()).remote(), True
    except ValueError:  # another driver created it between the lookup and here
        return ray.get_actor(name), False
