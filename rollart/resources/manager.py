"""The ResourceManager: a named Ray actor holding the run's pool accounts (Ray's GCS is its store).

In: pool specs (registered by whoever connects first, updated by later connections), reservations and
releases from the placement code. Out: placements, `NoRoom` refusals and snapshots (see accounts.py).

Guarantees: each run starts its own manager under a name of its own (`new_manager_name`: the base name and a
random suffix, so `ray list actors` still shows what it is). It never looks up an existing one: a process that
ran a job before (tests, notebooks) may still hold, in garbage not yet collected, a handle to the previous
run's manager, and a by-name lookup (`get_if_exists`) can hand back that actor while Ray is tearing it down or
let the old handle's collection end it mid-run (Ray issue 44083; a full test run lost its fault-injection run
that way). Its methods run one at a time, so reservations are atomic; it asks Ray for no CPU (it must never
wait for a core on a loaded machine); it is not detached, so it goes away with the handle that made it; it
lives on the driver's node (`on_driver_node`), so losing another node never takes the run's pool accounts.
"""

from __future__ import annotations

import uuid
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


def new_manager_name() -> str:
    """A name no other manager has: the base name and 8 random hex digits."""
    return f"{MANAGER_NAME}-{uuid.uuid4().hex[:8]}"


def start_manager(name: str) -> ray.actor.ActorHandle:
    """A new ResourceManager named `name`, on the driver's node; Ray refuses a name already taken."""
    return ResourceManager.options(name=name, scheduling_strategy=on_driver_node()).remote()
