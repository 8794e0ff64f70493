"""`WeightStore`: the driver's handle on the run's weight store — creates it, hands out both ends.

In: `WeightsConfig` (bucket size, versions kept, timeout, transport) and a Ray actor name (one store per run
and Ray namespace); with `weights.transport=collective` also the trainer ranks and inference workers the
weight group is made for and where its members meet (`collective(...)`). Out: a `StorePublisher` for the
trainer and `StoreSubscriber`s for inference workers — or, over a weight group, a `CollectivePublisher` and
`CollectiveSubscriber`s that fall back to those (collective.py) — all picklable: they travel to their
actors; and the held versions for metrics and tests.
"""

from __future__ import annotations

import ray

from rollart.config import WeightsConfig
from rollart.resources.manager import on_driver_node
from rollart.weights.collective import CollectivePublisher, CollectiveSubscriber, WeightGroupServer
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
        self.group: WeightGroupServer | None = None  # the weight group's rendezvous (`collective`)
        try:
            # on the driver's node: a store on a worker node would take every held version with it
            self.actor = WeightStoreActor.options(name=name, scheduling_strategy=on_driver_node()).remote(
                cfg.keep_versions)
        except ValueError as e:
            raise RuntimeError(
                f"a weight store named '{name}' already exists in this Ray namespace (another run?): {e}"
            ) from e

    def collective(self, senders: int, receivers: int, host: str = "127.0.0.1", interface: str = "") -> None:
        """Carry the weights over a weight group of `senders` trainer ranks and `receivers` inference workers,
        meeting at a store this process serves on `host` (gloo binding `interface`; '' = by host name)."""
        self.group = WeightGroupServer(host, senders, receivers, max(1, int(self.cfg.bucket_mb * 2**20)),
                                       self.cfg.timeout_s, interface)

    def publisher(self) -> StorePublisher | CollectivePublisher:
        store = StorePublisher(self.actor, self.cfg.bucket_mb, self.cfg.timeout_s)
        return CollectivePublisher(self.group.spec, store) if self.group else store

    def subscriber(self) -> StoreSubscriber | CollectiveSubscriber:
        store = StoreSubscriber(self.actor, self.cfg.timeout_s)
        return CollectiveSubscriber(self.group.spec, store) if self.group else store

    def fallback_reason(self) -> str:
        """Why the weights went back to the store path ('' while the weight group carries them, or unused)."""
        return self.group.fallback_reason() if self.group else ""

    def latest_version(self) -> int:
        return wait(self.actor.latest.remote(), self.cfg.timeout_s, "latest()")

    def versions(self) -> dict[int, int]:
        """{version: bytes} currently held (at most `weights.keep_versions`)."""
        return wait(self.actor.versions.remote(), self.cfg.timeout_s, "versions()")

    def close(self) -> None:
        ray.kill(self.actor, no_restart=True)
