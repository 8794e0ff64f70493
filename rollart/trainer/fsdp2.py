"""`train.strategy=fsdp2`: parameters, gradients and optimizer state sharded over the ranks (torch FSDP2).

In: `train.precision`, `train.offload`, this rank, the world size and the rank's device; the process group
(one rank: a private single-process gloo group is made here). Out: a `ParallelStrategy` (strategy.py).

`fully_shard` goes on every decoder layer and on the root (the policy module: embedding, tied head, final
norm), on an explicit 1-D device mesh — without one, on a machine with CUDA, FSDP2 would place CPU shards
on the GPU. Each parameter is split along dim 0 (rank r holds rows [r·c, (r+1)·c), c = ⌈rows / N⌉). A
layer's parameters are gathered for its forward, freed after it, gathered again for its backward; the
root's stay gathered from its forward to the end of its backward.

- `bf16`: FSDP2's mixed precision — the gathered parameters are cast to bfloat16 for compute, gradients are
  reduce-scattered in float32 into the float32 sharded parameters (the master weights) the optimizer owns.
- `offload`: `CPUOffloadPolicy` — sharded parameters, gradients and optimizer state live in host memory;
  each layer's parameters are copied to the device for its compute.
- Gradient accumulation: gradients are reduce-scattered after *every* micro-batch, so they stay sharded
  (skipping the sync would accumulate full, unsharded gradients on every rank — the memory FSDP exists to
  save); the micro-batch plan gives every rank the same number of micro-batches (packing.plan).
- Gloo has no PREMUL_SUM: FSDP2's default averaging is used; the trainer's loss scaling is the same as
  under DDP.
- One rank in float32 without offload has nothing to shard, gather or reduce: the module stays plain (no
  `fully_shard`, no DTensors) and the step costs what plain PyTorch's does — FSDP2's hooks, DTensor dispatch in
  every optimizer op and a one-rank all-reduce per norm made it slower than a plain step on the default job's
  model (issue 40; no figure is recorded). The arithmetic is the same, and checkpoints are the same files (a plain
  tensor is rank 0's whole rows), so a run resumes across world sizes as before. bf16 keeps FSDP2 on one
  rank too: its mixed precision (bfloat16 copies of the parameters) is not autocast's, and a one-rank run
  computes as its N-rank run would.
- Gloo (CPU ranks): FSDP2's all-gathers and reduce-scatters run in place, as all-reduces over the buffers
  FSDP2 allocates for them (`InPlaceAllGather`, `InPlaceReduceScatter`). Gloo's own collectives copy: measured
  here, a reduce-scatter of an 84 MB float32 input (the 32 K × 640 embedding's gradient) took 124 MB more
  and 529 ms, the all-reduce in place 2 MB and 128 ms; an all-gather into a 42 MB bf16 output 80 MB more and
  180 ms, in place 2 MB and 138 ms. The results are bit for bit the same (the all-gather sums bytes with
  zeros; a 2-rank average is one addition either way). NCCL's collectives are used as they are.
"""

from __future__ import annotations

import datetime
from contextlib import AbstractContextManager, nullcontext
from typing import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rollart.base.shards import row_range
from rollart.config import TrainConfig
from rollart.trainer.gradnorm import squared_sum


class InPlaceAllGather:
    """FSDP2's all-gather (its `set_custom_all_gather` protocol) for gloo: this rank's shard is already in its
    slot of the output (FSDP2 copies it there); every other slot is zeroed and the output's bytes are summed
    over the ranks in place — each byte is one rank's value plus zeros, so the result is exact."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        rank, n = group.rank(), input_tensor.numel()
        slot = output_tensor.view(-1).narrow(0, rank * n, n)
        if slot.data_ptr() != input_tensor.data_ptr():
            slot.copy_(input_tensor.view(-1))
        everything = output_tensor.view(-1).view(torch.uint8)
        width = n * input_tensor.element_size()
        everything[:rank * width].zero_()
        everything[(rank + 1) * width:].zero_()
        return dist.all_reduce(everything, group=group, async_op=async_op)


class InPlaceReduceScatter:
    """FSDP2's reduce-scatter (its `set_custom_reduce_scatter` protocol) for gloo: the input — a buffer FSDP2
    allocates for this call and never reads again — is all-reduced in place with FSDP2's op, then this rank's
    part is copied out."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: dist.ReduceOp, async_op: bool = False) -> dist.Work | None:
        dist.all_reduce(input_tensor, op=op, group=group)
        n = output_tensor.numel()
        output_tensor.view(-1).copy_(input_tensor.view(-1).narrow(0, group.rank() * n, n))
        return None


class Fsdp2Strategy:
    name = "fsdp2"

    def __init__(self, train: TrainConfig, rank: int, world_size: int, device: torch.device) -> None:
        if not dist.is_initialized():
            if world_size != 1:
                raise RuntimeError(f"train.strategy=fsdp2 with {world_size} ranks needs the process group first")
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=datetime.timedelta(seconds=train.timeout_s))
        if dist.get_world_size() != world_size:
            raise RuntimeError(f"train.workers={world_size} but the process group has {dist.get_world_size()} ranks")
        self.rank, self.world_size, self.device = rank, world_size, device
        self.mesh = init_device_mesh(device.type, (world_size,))
        self.mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                   if train.precision == "bf16" else MixedPrecisionPolicy())
        self.offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if train.offload else OffloadPolicy()
        self.param_device = torch.device("cpu") if train.offload else device
        self.plain = world_size == 1 and train.precision == "fp32" and not train.offload  # (module docstring)

    def shard(self, module: nn.Module, layers: Sequence[nn.Module]) -> None:
        if self.plain:
            return
        for unit in [*layers, module]:
            fully_shard(unit, mesh=self.mesh, mp_policy=self.mp, offload_policy=self.offload)
            if self.world_size > 1 and dist.get_backend() == "gloo":
                unit.set_custom_all_gather(InPlaceAllGather())  # type: ignore[operator]
                unit.set_custom_reduce_scatter(InPlaceReduceScatter())  # type: ignore[operator]

    def wrap(self, module: nn.Module) -> nn.Module:
        return module

    def compute(self) -> AbstractContextManager[None]:
        return nullcontext()

    def sync(self, wrapped: nn.Module, last: bool) -> AbstractContextManager[None]:
        return nullcontext()  # reduce-scatter every micro-batch: gradients stay sharded (module docstring)

    def squared_norm(self, tensors: Iterable[torch.Tensor]) -> float:
        """Σ‖t‖² of the full tensors: each rank's rows in float64, summed over the ranks (a tensor every rank
        holds whole counts once)."""
        if self.plain:
            return float(sum(squared_sum(t) for t in tensors))
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for t in tensors:
            if isinstance(t, DTensor) or self.rank == 0:
                total += squared_sum(self.local(t)).to(self.device)
        dist.all_reduce(total)
        return float(total)

    def full(self, t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t

    def rows(self, t: torch.Tensor) -> tuple[int, int] | None:
        if not isinstance(t, DTensor):
            return None
        start, stop = row_range(t.shape[0], self.rank, self.world_size)
        if t.to_local().shape[0] != stop - start:
            raise RuntimeError(f"FSDP2 shard of a {tuple(t.shape)} tensor on rank {self.rank}: "
                               f"{t.to_local().shape[0]} rows, expected rows {start}:{stop}")
        return start, stop

    def local(self, t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    def release(self, module: nn.Module) -> None:
        """Free `module`'s gathered parameters now (FSDP2's `reshard`, not recursive). In a backward its gradients
        stay where FSDP2 collects them at its post-backward, which then reduce-scatters them as usual. A plain
        module gathered nothing."""
        if not self.plain:
            module.reshard()  # type: ignore[operator]

    def like(self, param: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if not isinstance(param, DTensor):
            return rows.to(param.device)
        return DTensor.from_local(rows.to(param.to_local().device), param.device_mesh, param.placements,
                                  run_check=False, shape=param.shape, stride=param.stride())
