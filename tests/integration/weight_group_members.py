"""Members of a weight group as plain processes (no Ray), for the collective transfer tests.

`trainer_sender(rank, world, ...)`: a real `Trainer` rank (fsdp2 or ddp, one gloo process group of its own),
which sends its rows of versions 0 and 1 (after one train step) through a `CollectivePublisher` and writes
the full weights it trained (gathered once, for the check) to `<out>/v<version>.safetensors`.
`receiver(index, ...)`: a `CollectiveSubscriber` that pulls versions and writes what it got to
`<out>/r<index>-v<version>.safetensors`, or `<out>/r<index>-fallback.txt` with the reason it fell back.
Tensors come back through safetensors files; nothing is pickled but plain values.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from trainer_helpers import synthetic_batch


class NoStore:
    """The store fallback of these tests: it has nothing (a test that expects a fallback checks the reason)."""

    async def latest_version(self) -> int:
        return -1

    async def pull(self, version: int) -> dict[str, Any]:
        raise RuntimeError("no store in this test")

    def publish(self, version: int, weights: Any, replace: bool = False) -> dict[str, float]:
        return {}

    def latest(self) -> int:
        return -1


def trainer_sender(rank: int, world: int, spec: Any, model_path: str, strategy: str, out: str,
                   init_file: str) -> None:
    from rollart.algo import PolicyObjective
    from rollart.config import PoolConfig, RunConfig, default_pools
    from rollart.trainer import Trainer
    from rollart.weights.collective import CollectivePublisher

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    pools = {**default_pools(), "train": PoolConfig(kind="cpu", capacity=world)}
    cfg = RunConfig(model={"path": model_path}, pools=pools, train={"workers": world, "strategy": strategy})
    trainer = Trainer(cfg, PolicyObjective.of(cfg), rank=rank, world_size=world)
    publisher = CollectivePublisher(spec, NoStore())
    metrics = []
    for version in (0, 1):
        if version == 1:
            trainer.train_step(synthetic_batch(version=0, n=8))
        metrics.append(publisher.publish_rows(trainer.version, rank, world, trainer.weight_specs(),
                                              trainer.row_chunks()))
        full = {k: v.clone().contiguous() for k, v in trainer.state_dict().items()}  # a collective: every rank
        if rank == 0:
            save_file(full, os.path.join(out, f"v{trainer.version}.safetensors"))
        if version == 0:
            wait_for_receivers(out, spec.receivers, 0)
    Path(out, f"sender{rank}.json").write_text(json.dumps(metrics))
    dist.destroy_process_group()


def plain_sender(rank: int, world: int, spec: Any, out: str, versions: int) -> None:
    """Sends rows of a fixed set of odd tensors (uneven rows, a 0-d one, bf16, a tied name) for `versions` versions."""
    from rollart.base.shards import row_range
    from rollart.weights.collective import CollectivePublisher

    publisher = CollectivePublisher(spec, NoStore())
    for version in range(versions):
        tensors = odd_tensors(version)
        specs = [((name, *(("tied.weight",) if name == "embed.weight" else ())), str(t.dtype).removeprefix("torch."),
                  tuple(t.shape)) for name, t in tensors.items()]
        chunks = []
        for t in tensors.values():
            start, stop = row_range(t.shape[0] if t.dim() else 1, rank, world)
            chunks.append(t[start:stop] if t.dim() else (t if start < stop else t.new_empty((0,))))
        metrics = publisher.publish_rows(version, rank, world, specs, chunks)
        Path(out, f"sender{rank}-v{version}.json").write_text(json.dumps(metrics))
        if version + 1 < versions:
            wait_for_receivers(out, spec.receivers, version)


def wait_for_receivers(out: str, receivers: int, version: int, timeout_s: float = 60.0) -> None:
    """Until every receiver has taken `version` (a subscriber keeps only the newest version it received)."""
    deadline = time.monotonic() + timeout_s
    while not all(Path(out, f"r{i}-v{version}.safetensors").exists() for i in range(receivers)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the receivers did not take v{version}")
        time.sleep(0.05)


def odd_tensors(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "embed.weight": torch.randn(37, 8, generator=g),  # 37 rows over 2 or 3 senders: uneven chunks
        "layer.weight": torch.randn(10, 6, generator=g).to(torch.bfloat16),
        "one_row.bias": torch.randn(1, 5, generator=g),  # only sender 0 holds rows
        "scale": torch.tensor(float(version) + 0.5),  # 0-d
        "norm.weight": torch.randn(16, generator=g),
    }


def receiver(index: int, spec: Any, out: str, versions: list[int], timeout_s: float = 60.0) -> None:
    from rollart.weights.collective import CollectiveSubscriber

    torch.set_num_threads(1)
    subscriber = CollectiveSubscriber(spec, NoStore())

    async def main() -> None:
        deadline = time.monotonic() + timeout_s
        for version in versions:
            while await subscriber.latest_version() < version and not subscriber.fell_back:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"receiver {index}: v{version} never came")
                await asyncio.sleep(0.05)
            if subscriber.fell_back:
                Path(out, f"r{index}-fallback.txt").write_text(subscriber.fell_back)
                return
            tensors = await subscriber.pull(version)
            shared = sorted(k for k in tensors for j in tensors if k < j and tensors[k].data_ptr() == tensors[j].data_ptr())
            Path(out, f"r{index}-v{version}-tied.json").write_text(json.dumps(shared))
            save_file({k: v.clone() for k, v in tensors.items()}, os.path.join(out, f"r{index}-v{version}.safetensors"))
        subscriber.close()

    asyncio.run(main())
