"""`StoreSubscriber` — an inference worker's end of the weight store (implements `WeightSubscriber`).

In: awaited calls from the inference plane, on the event loop of the worker that keeps generating:
`latest_version()`, then `pull(version)`. Both are coroutines that await Ray's object refs (never a blocking
`ray.get`, which would stall the loop serving every request); unpacking the buckets into tensors runs in a
worker thread. Out: `{name: torch.Tensor}` on CPU, bit-identical to what the trainer published for that
version (a `LoraAdapter` of such tensors when the version is adapter-only); `last_metrics` after each pull
(`time/weights.pull`, `weights/pull_mb`); `version`, the newest version pulled so far.

Guarantees: a subscriber's version never goes backwards — `pull(v)` with v older than a version it already
pulled is an error; `latest_version()` is monotonic because the store only moves forward.
Picklable: a copy sent to another process starts afresh (version -1). Every wait has `weights.timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rollart.types import LoraAdapter
from rollart.weights.buckets import Bucket, unpack
from rollart.weights.store import wait_async
from rollart.weights.timing import PULL


class StoreSubscriber:
    def __init__(self, store: Any, timeout_s: float) -> None:
        self.store = store  # WeightStoreActor handle
        self.timeout_s = timeout_s
        self._version = -1
        self.last_metrics: dict[str, float] = {}

    def __reduce__(self):
        return (StoreSubscriber, (self.store, self.timeout_s))

    @property
    def version(self) -> int:
        """The newest version pulled (-1 before the first pull)."""
        return self._version

    async def latest_version(self) -> int:
        """The newest version the store holds (-1 before the trainer published version 0)."""
        return await wait_async(self.store.latest.remote(), self.timeout_s, "latest()")

    async def pull(self, version: int) -> dict[str, Any] | LoraAdapter:
        if version < self._version:
            raise ValueError(
                f"pull(v{version}) would take this worker's weights backwards (it already pulled v{self._version})"
            )
        start = time.perf_counter()
        refs, metas, adapter_config = await wait_async(self.store.get.remote(version), self.timeout_s,
                                                       f"get(v{version})")
        arrays = await wait_async(asyncio.gather(*refs), self.timeout_s,
                                  f"fetching the {len(refs)} buckets of v{version}")
        tensors = await asyncio.to_thread(unpack, [Bucket(tuple(a)) for a in arrays], metas)
        if version < self._version:  # a concurrent pull of a newer version finished first (no await since)
            raise ValueError(
                f"pull(v{version}) finished after v{self._version}: dropping it so the version never goes back"
            )
        self._version = version
        self.last_metrics = {
            PULL: time.perf_counter() - start,
            "weights/pull_mb": sum(a.nbytes for arr in arrays for a in arr) / 2**20,
        }
        return LoraAdapter(adapter_config, tensors) if adapter_config is not None else tensors
