"""The parallelism seam: how the ranks hold the model, synchronise gradients and give tensors back in full.

The trainer (core.py) is the algorithm — objective, mini- and micro-batches, metrics, versions — and never
asks which strategy it has; a `ParallelStrategy` is a member of it (composition), chosen by
`train.strategy`:

- `ddp` (ddp.py): every rank holds the whole model, gradients and optimizer state; torch
  DistributedDataParallel all-reduces gradients at the last micro-batch of each optimizer step.
- `fsdp2` (fsdp2.py): torch FSDP2 (`fully_shard`) per decoder layer and on the root, on an explicit device
  mesh: each rank keeps 1/N of every parameter, gradient and optimizer state and gathers a layer's weights
  only while it computes.

What a strategy answers (tensors are the module's own parameters, buffers and optimizer states):
`shard` the freshly built (meta) module, `param_device` to materialise it on, `wrap` it for training
forwards, `compute()` (the forward's precision context), `sync(module, last)` (whether this micro-batch's
backward synchronises gradients), `squared_norm(tensors)` (Σ‖t‖² of the full tensors, in float64 —
`gradnorm.squared_sum` per tensor — the same on every rank), `full(t)` (the whole tensor, on every rank: a
collective under fsdp2, so every rank calls it in the same order), `rows(t)` (the rows of the full tensor
this rank holds; None = all of it, and then rank 0 alone writes it), `local(t)` (those rows as a plain
tensor, writable in place), `like(param, rows)` (an optimizer state for `param` from this rank's rows) and
`release(module)` (in a backward: `module`'s own gathered parameters will not be read again before its next
forward — fsdp2 frees them; ddp gathers nothing).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Iterable, Protocol, Sequence

import torch
from torch import nn

from rollart.config import TrainConfig, device_lacks_bf16


class ParallelStrategy(Protocol):
    name: str
    param_device: torch.device

    def shard(self, module: nn.Module, layers: Sequence[nn.Module]) -> None: ...

    def wrap(self, module: nn.Module) -> nn.Module: ...

    def compute(self) -> AbstractContextManager[None]: ...

    def sync(self, wrapped: nn.Module, last: bool) -> AbstractContextManager[None]: ...

    def squared_norm(self, tensors: Iterable[torch.Tensor]) -> float: ...

    def full(self, t: torch.Tensor) -> torch.Tensor: ...

    def rows(self, t: torch.Tensor) -> tuple[int, int] | None: ...

    def local(self, t: torch.Tensor) -> torch.Tensor: ...

    def like(self, param: torch.Tensor, rows: torch.Tensor) -> torch.Tensor: ...

    def release(self, module: nn.Module) -> None: ...


def make_strategy(train: TrainConfig, rank: int, world_size: int, device: torch.device) -> ParallelStrategy:
    """The strategy `train.strategy` names, for this rank (the process group must exist when world_size > 1)."""
    # the config refuses this on a local cluster when it loads; here it is checked on the rank's own machine
    if train.precision == "bf16" and (lacks := device_lacks_bf16(str(device))):
        raise ValueError(f"train.precision=bf16 on the trainer's device {device}: {lacks}; use train.precision=fp32")
    if train.strategy == "fsdp2":
        from rollart.trainer.fsdp2 import Fsdp2Strategy

        return Fsdp2Strategy(train, rank, world_size, device)
    from rollart.trainer.ddp import DdpStrategy

    return DdpStrategy(train, world_size, device)
