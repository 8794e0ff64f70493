"""The versioned weight store: a named Ray actor that holds the bucket refs of the last K versions.

In: from publishers, `register(version, bucket refs, metas, nbytes, adapter_config)` (the config is PEFT's
adapter config for an adapter-only version of a LoRA run, None for full weights); from subscribers, `latest()` and
`get(version)` (the driver-side handle that creates it is `rollart.weights.client.WeightStore`). Out: the refs (the buckets themselves stay in the Ray object store; the actor never
touches their bytes, so it needs no CPU and no memory beyond the refs).

Guarantees: versions only go forward (registering a version ≤ the latest is an error, except with
`replace=True`: a rebuilt trainer re-registers bit-identical buckets of a version the store holds, since
the dead trainer's went with it — a version no longer held is then ignored); at most
`weights.keep_versions` versions are held — registering one more drops the oldest's refs, so Ray frees its
buckets once no subscriber still holds them (a pull in progress keeps its own refs, it never breaks);
asking for a dropped version is an error that lists what is held. Every call from the client side has a
timeout (`weights.timeout_s`) and a message.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable

import ray

from rollart.weights.buckets import TensorMeta

STORE_NAME = "rollart_weight_store"


@ray.remote(num_cpus=0)
class WeightStoreActor:
    def __init__(self, keep_versions: int) -> None:
        self._keep = keep_versions
        self._versions: dict[int, tuple[list[ray.ObjectRef], list[TensorMeta], int, dict | None]] = {}
        self._latest = -1

    def register(self, version: int, refs: list[ray.ObjectRef], metas: list[TensorMeta], nbytes: int,
                 adapter_config: dict | None = None, replace: bool = False) -> list[int]:
        """Hold `refs` (a list, so Ray passes the refs, not their values) as `version`; returns dropped versions."""
        if replace and version <= self._latest:
            if version in self._versions:
                self._versions[version] = (list(refs), list(metas), int(nbytes), adapter_config)
            return []
        if version <= self._latest:
            raise ValueError(f"weight version {version} is not newer than the latest published ({self._latest})")
        self._versions[version] = (list(refs), list(metas), int(nbytes), adapter_config)
        self._latest = version
        dropped = sorted(self._versions)[: -self._keep]
        for v in dropped:
            del self._versions[v]
        return dropped

    def latest(self) -> int:
        return self._latest

    def get(self, version: int) -> tuple[list[ray.ObjectRef], list[TensorMeta], dict | None]:
        if version not in self._versions:
            raise KeyError(
                f"weight version {version} is not in the store (held: {sorted(self._versions)}; "
                f"it keeps the last {self._keep}); pull latest_version() instead"
            )
        refs, metas, _, adapter_config = self._versions[version]
        return refs, metas, adapter_config

    def versions(self) -> dict[int, int]:
        """{version: bytes} of the versions held."""
        return {v: n for v, (_, _, n, _) in sorted(self._versions.items())}


async def wait_async(awaitable: Awaitable[Any], timeout_s: float, what: str) -> Any:
    """`await` an ObjectRef (or a gather of them) with the same bound and message as `wait`; for callers on an
    event loop (an inference worker), where a blocking `ray.get` would stall every request it serves."""
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except asyncio.TimeoutError as e:
        raise TimeoutError(f"weight store: {what} did not finish within {timeout_s:.0f}s (weights.timeout_s)") from e


def wait(ref: Any, timeout_s: float, what: str) -> Any:
    """`ray.get` with a bound and a message saying what did not answer."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        raise TimeoutError(f"weight store: {what} did not finish within {timeout_s:.0f}s (weights.timeout_s)") from e
