"""`WeightStore`: the driver's handle on the run's weight store — creates it, hands out both ends.

In: `WeightsConfig` (bucket size, versions kept, timeout) and a Ray actor name (one store per run and Ray
namespace). Out: a `StorePublisher` for the trainer and `StoreSubscriber`s for inference workers (both
picklable: they travel to their actors), and the held versions for metrics and tests.
"""

from __future__ import annotations

import ray

from rollart.config import WeightsConfig
from rollart.resources.manager import on_driver_node
from rollart.weights.publisher import StorePublisher
from rollart.weights.store import STORE_NAME, WeightStoreActor, wait
from rollart.weights.subscriber import StoreSubscriber


class WeightStore:
    """Driver-side handle: creates the named store actor and hands out publishers and subscribers.

    >>> store = WeightStore(cfg.weights)           # once per run, on the driver
    >>> publisher = store.publisher()              # → TrainerRanks (rank 0 publishes)
    >>> subscriber = store.subscriber()            # → each inference worker (picklable)
    """

    def __init__(self, cfg: WeightsConfig, name: str = STORE_NAME) -> None:
        self.cfg = cfg
        self.name = name
        try:
            # on the driver's node: a store on a worker node would take every held version with it
            self.actor = WeightStoreActor.options(name=name, scheduling_strategy=on_driver_node()).remote(
                cfg.keep_versions)
        except ValueError as e:
            raise RuntimeError(
                f"a weight store named '{name}' already exists in this Ray namespace (another run?): {e}"
            ) from e

    def publisher(self) -> StorePublisher:
        return StorePublisher(self.actor, self.cfg.bucket_mb, self.cfg.timeout_s)

    def subscriber(self) -> StoreSubscriber:
        return StoreSubscriber(self.actor, self.cfg.timeout_s)

    def latest_version(self) -> int:
        return wait(self.actor.latest.remote(), self.cfg.timeout_s, "latest()")

    def versions(self) -> dict[int, int]:
        """{version: bytes} currently held (at most `weights.keep_versions`)."""
        return wait(self.actor.versions.remote(), self.cfg.timeout_s, "versions()")

    def close(self) -> None:
        ray.kill(self.actor, no_restart=True)
