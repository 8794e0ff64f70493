"""`StorePublisher` — the trainer's end of the weight store (implements `rollart.types.WeightPublisher`).

In: a policy version and the trainer's weights: its named tensors — a mapping, or (name, tensor) pairs from
an iterator that gathers each tensor just before it is needed (a sharded trainer: each bucket is put into
the object store as soon as it is full, so the trainer never holds the whole model) — or a `LoraAdapter` (a
LoRA run: only the adapter tensors, plus PEFT's adapter config, which the store keeps beside the version).
Out: the version's buckets in the Ray object store, registered with the store actor; metrics
`time/weights.publish` (pack + put + register), `weights/publish_mb`, `weights/buckets`.

Guarantees: the bytes put are exactly the tensors' bytes at the time of the call (the object store holds
its own copy: training may go on at once); `publish` returns only once the store holds the version, so a
subscriber that sees it as latest can pull it. Ray ties the buckets to the process that put them: when a
trainer dies, the versions it published become unpullable until a rebuilt trainer, replaying the same
steps, publishes them again with `replace=True` (bit-identical tensors; the store swaps the buckets). The
object is picklable and is handed to the trainer actor; the trainer never imports this package.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

import ray

from rollart.types import LoraAdapter
from rollart.weights.buckets import iter_buckets
from rollart.weights.store import wait
from rollart.weights.timing import PUBLISH


class StorePublisher:
    def __init__(self, store: Any, bucket_mb: float, timeout_s: float) -> None:
        self.store = store  # WeightStoreActor handle
        self.bucket_bytes = max(1, int(bucket_mb * 2**20))
        self.timeout_s = timeout_s

    def publish(self, version: int, weights: Mapping[str, Any] | Iterable[tuple[str, Any]] | LoraAdapter,
                replace: bool = False) -> Mapping[str, float]:
        start = time.perf_counter()
        adapter_config = dict(weights.config) if isinstance(weights, LoraAdapter) else None
        named = weights.tensors if isinstance(weights, LoraAdapter) else weights
        refs, metas, nbytes = [], [], 0
        for bucket, names in iter_buckets(named.items() if isinstance(named, Mapping) else named, self.bucket_bytes):
            refs.append(ray.put(bucket.arrays))  # the object store's copy: the tensors can go at once
            metas += names
            nbytes += bucket.nbytes
        wait(self.store.register.remote(version, refs, metas, nbytes, adapter_config, replace), self.timeout_s,
             f"register(v{version})")
        return {PUBLISH: time.perf_counter() - start, "weights/publish_mb": nbytes / 2**20,
                "weights/buckets": float(len(refs))}

    def latest(self) -> int:
        """The newest version the store holds (-1: none)."""
        return int(wait(self.store.latest.remote(), self.timeout_s, "latest()"))
