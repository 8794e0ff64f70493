"""`rollart bench weights`, sharded rows: weights from W trainer ranks that each hold only their shard, through the
store (today's path: every rank takes part in gathering each full tensor, rank 0 puts the buckets into the
object store) and over the weight group (`weights.transport=collective`: each rank sends its own rows).

Setup (one embedded Ray): `SHARDS` *sender* actors, each building the model from the same seed and keeping only
its rows of every tensor (`rollart.base.shards.row_range`, FSDP2's chunks), joined in a gloo process group of
their own (the all-gathers of the store path, as FSDP2's `full_tensor`); the *inference* actor of
`benchmarks/weights_sides.py` (generating without pause, pulling in the background) with a store or a collective
subscriber. Per round, as for the full-model rows: naive (stop, publish, pull, swap) and overlapped
(publish while generating, stop only to wait and swap); after every swap each tensor's rows are hashed on
both sides, per sender — the inference weights must be the trainer's, bit for bit.

Memory: before each publish the sender's peak RSS is reset (`/proc/PID/clear_refs`), after it read
(`VmHWM`), in the actor's own process with `MALLOC_MMAP_THRESHOLD_=65536` (freed buffers go back to the
system, so a peak is a peak): `sender_peak_over_shard` = (shard + the largest rise of any sender during a
publish) ÷ shard — the target is ≤ 1.2; the store path's rank 0 writes the whole model into the object
store's shared memory, which its RSS counts. Bytes on the wire per version: every receiver gets the whole
model once; the store path also puts it once (`moved_mb_per_version`).
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

import ray
import torch
import torch.distributed as dist

from benchmarks.weights_sides import InferenceSide, build_model
from rollart.base.shards import row_range
from rollart.config import WeightsConfig
from rollart.resources.nodes import loopback_interface
from rollart.weights import WeightStore

SHARDS = 2
TIMEOUT_S = 300.0
MALLOC_ENV = {"env_vars": {"MALLOC_MMAP_THRESHOLD_": "65536"}}


def rss_kb(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux ≥ 4.0)


@ray.remote(num_cpus=0)
class ShardSender:
    """One trainer rank holding only its rows of the model (see the module docstring)."""

    def __init__(self, spec: str, rank: int, world: int, init: str, publisher: Any) -> None:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface() or "lo")  # its sockets on loopback only
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        model = build_model(spec)
        groups: dict[int, list[str]] = {}
        tensors: dict[int, torch.Tensor] = {}
        for name, t in model.state_dict().items():
            groups.setdefault(t.data_ptr(), []).append(name)
            tensors[t.data_ptr()] = t
        self.specs, self.rows = [], []
        for key, names in groups.items():
            t = tensors[key].detach()
            start, stop = row_range(t.shape[0] if t.dim() else 1, rank, world)
            self.specs.append((tuple(names), str(t.dtype).removeprefix("torch."), tuple(t.shape)))
            self.rows.append((t[start:stop] if t.dim() else t.reshape(1)[start:stop]).clone())
        del model, tensors
        self.rank, self.world, self.publisher = rank, world, publisher

    def pid(self) -> int:
        return os.getpid()

    def shard_mb(self) -> float:
        return sum(r.nbytes for r in self.rows) / 2**20

    def bump(self) -> None:
        """A new version: a cheap in-place change standing in for an optimizer step."""
        with torch.no_grad():
            for r in self.rows:
                if r.is_floating_point():
                    r.add_(1e-3)

    def publish_store(self, version: int) -> dict[str, float]:
        """Today's path under FSDP2: every rank takes part in gathering each full tensor, rank 0 publishes."""
        def gathered() -> Any:
            for (names, dtype, shape), rows in zip(self.specs, self.rows):
                per = -(-(shape[0] if shape else 1) // self.world)
                padded = torch.zeros((per, *shape[1:]), dtype=rows.dtype)
                padded[:rows.shape[0]] = rows
                parts = [torch.empty_like(padded) for _ in range(self.world)]
                dist.all_gather(parts, padded)
                full = torch.cat(parts)[:shape[0] if shape else 1].reshape(shape)
                for name in names:
                    yield name, full

        if self.rank != 0:
            for _ in gathered():
                pass
            return {}
        return dict(self.publisher.publish(version, gathered()))

    def publish_collective(self, version: int) -> dict[str, float]:
        return dict(self.publisher.publish_rows(version, self.rank, self.world, self.specs, self.rows))

    def row_hashes(self) -> dict[str, str]:
        return {names[0]: hashlib.sha256(r.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                for (names, _, _), r in zip(self.specs, self.rows)}


def inference_row_hashes(infer: Any, names: list[str], rank: int, world: int) -> dict[str, str]:
    return ray.get(infer.row_hashes.remote(names, rank, world), timeout=TIMEOUT_S)


def measure(spec: str, rounds: int, transport: str, bucket_mb: float) -> dict[str, Any]:
    """One row: `transport` ('store' or 'collective') from `SHARDS` sharded senders to one inference actor."""
    store = WeightStore(WeightsConfig(bucket_mb=bucket_mb, keep_versions=2, timeout_s=TIMEOUT_S, transport=transport),
                        name=f"bench-ws-{uuid.uuid4().hex[:8]}")
    if transport == "collective":
        store.collective(SHARDS, 1, "127.0.0.1", loopback_interface() or "")
    init = f"file://{tempfile.mkdtemp(prefix='rollart-bench-shards-')}/pg"
    senders = [ShardSender.options(runtime_env=MALLOC_ENV).remote(spec, r, SHARDS, init, store.publisher())
               for r in range(SHARDS)]
    infer = InferenceSide.remote(spec, store.subscriber(), False)
    get = lambda ref: ray.get(ref, timeout=TIMEOUT_S)  # noqa: E731
    get(infer.latest.remote())  # a collective subscriber starts receiving (the senders' first publish waits for it)
    med = statistics.median
    pids = get([s.pid.remote() for s in senders])
    shard_mb = max(get([s.shard_mb.remote() for s in senders]))
    names = list(get(senders[0].row_hashes.remote()))

    def publish(version: int) -> tuple[dict[str, float], float]:
        """All senders publish `version`; (rank 0's metrics, the largest peak-RSS rise of a sender, MB)."""
        before = [rss_kb(pid, "VmRSS") for pid in pids]
        for pid in pids:
            reset_peak(pid)
        method = "publish_collective" if transport == "collective" else "publish_store"
        results = get([getattr(s, method).remote(version) for s in senders])
        rise = max(rss_kb(pid, "VmHWM") - b for pid, b in zip(pids, before))
        return results[0], rise / 1024

    def check(version: int) -> None:
        for rank, sender in enumerate(senders):
            if inference_row_hashes(infer, names, rank, SHARDS) != get(sender.row_hashes.remote()):
                raise AssertionError(f"v{version}: the inference weights differ from sender {rank}'s rows")

    try:
        version = 0
        naive, rises, wire = [], [], []
        for _ in range(rounds):
            get([s.bump.remote() for s in senders])
            get(infer.suspend.remote())
            start = time.perf_counter()
            metrics, rise = publish(version)
            get(infer.pull_and_swap.remote(version))
            naive.append(time.perf_counter() - start)
            get(infer.resume.remote())
            rises.append(rise)
            check(version)
            version += 1
        get(infer.set_background_pull.remote(True))
        exposed, publish_s = [], []
        for _ in range(rounds):
            get([s.bump.remote() for s in senders])
            metrics, rise = publish(version)
            rises.append(rise)
            publish_s.append(metrics.get("time/weights.publish", 0.0))
            wire.append(metrics.get("weights/wire_mb", 0.0))
            get(infer.wait_batches.remote(1))
            got = get(infer.suspend_swap_resume.remote(version))
            exposed.append(got["exposed"])
            check(version)
            version += 1
        model_mb = get(infer.weights_mb.remote())
        return {
            "model": spec, "transport": transport, "senders": SHARDS, "rounds": rounds, "bucket_mb": bucket_mb,
            "weights_mb": round(model_mb, 1), "shard_mb": round(shard_mb, 2),
            "sender_peak_rise_mb": round(max(rises), 2), "sender_peak_over_shard": round((shard_mb + max(rises)) / shard_mb, 3),
            "naive_s": round(med(naive), 4), "overlap_publish_s": round(med(publish_s), 4),
            "exposed_s": round(med(exposed), 4), "exposed_fraction": round(med(exposed) / med(naive), 4),
            # bytes moved per version: what the receiver gets (the whole model), plus, on the store path, the put
            "moved_mb_per_version": round(model_mb * (1 if transport == "collective" else 2), 1),
        }
    finally:
        ray.get(infer.close.remote(), timeout=TIMEOUT_S)
        for actor in (*senders, infer):
            ray.kill(actor, no_restart=True)
        store.close()

