"""`train.strategy=ddp`: a full replica on every rank, gradients all-reduced by DistributedDataParallel.

In: `train.precision`, the world size, the rank's device. Out: a `ParallelStrategy` (strategy.py). One rank
trains the plain module (no wrapper, no process group). `bf16` runs the forward under autocast: matmuls
in bfloat16 over the float32 parameters, so gradients, their all-reduce and the optimizer stay float32.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Iterable, Sequence

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rollart.config import TrainConfig
from rollart.trainer.gradnorm import squared_sum


class DdpStrategy:
    name = "ddp"

    def __init__(self, train: TrainConfig, world_size: int, device: torch.device) -> None:
        self.world_size, self.device, self.precision = world_size, device, train.precision
        self.param_device = device

    def shard(self, module: nn.Module, layers: Sequence[nn.Module]) -> None:
        """Nothing to shard: every rank holds all of it."""

    def wrap(self, module: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return module
        return DistributedDataParallel(module, device_ids=[self.device.index or 0] if self.device.type == "cuda"
                                       else None)

    def compute(self) -> AbstractContextManager[None]:
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def sync(self, wrapped: nn.Module, last: bool) -> AbstractContextManager[None]:
        """All-reduce only at the optimizer step's last micro-batch (the gradients are full on every rank)."""
        if last or not isinstance(wrapped, DistributedDataParallel):
            return nullcontext()
        return wrapped.no_sync()

    def squared_norm(self, tensors: Iterable[torch.Tensor]) -> float:
        """Σ‖t‖² in float64 (every rank holds the whole tensors)."""
        return float(sum(squared_sum(t) for t in tensors))

    def full(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def rows(self, t: torch.Tensor) -> tuple[int, int] | None:
        return None

    def local(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def like(self, param: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return rows.to(param.device)

    def release(self, module: nn.Module) -> None:
        """Nothing is gathered: every rank holds all of it."""
