"""`Sums`: a train step's statistics, summed over micro-batches and optimizer steps, then over the ranks.

In: the statistics dicts the objective (and the trainer) return per micro-batch: scalars (tensors of one
element or floats) and count vectors (e.g. a histogram). Out: one dict, the same on every rank.

Rules, by key: a name ending in `_max` keeps the maximum (starting from 0); a vector adds element-wise (in
float64); any other scalar adds (in Python floats, float64). Across ranks the key sets are merged first
(a rank whose micro-batches were all fillers has counted nothing), so every rank reduces the same tensors
in the same order — required, since each reduction is a collective.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.distributed as dist
from torch import Tensor


class Sums:
    def __init__(self) -> None:
        self.values: dict[str, float | Tensor] = {}

    def add(self, stats: Mapping[str, Tensor | float]) -> None:
        for key, value in stats.items():
            if isinstance(value, Tensor) and value.numel() > 1:
                vector = value.detach().to(torch.float64).cpu()
                old = self.values.get(key)
                self.values[key] = vector.clone() if not isinstance(old, Tensor) else old + vector
            elif key.endswith("_max"):
                self.values[key] = max(float(self.values.get(key, 0.0)), float(value))  # type: ignore[arg-type]
            else:
                self.values[key] = float(self.values.get(key, 0.0)) + float(value)  # type: ignore[arg-type]

    def all_reduce(self, world_size: int, device: torch.device) -> dict[str, float | Tensor]:
        """The sums over every rank (a collective when world_size > 1: every rank calls it)."""
        if world_size == 1:
            return dict(self.values)
        shapes: dict[str, int] = {k: (v.numel() if isinstance(v, Tensor) else 0) for k, v in self.values.items()}
        gathered: list[dict[str, int]] = [{} for _ in range(world_size)]
        dist.all_gather_object(gathered, shapes)
        merged: dict[str, int] = {}
        for rank_shapes in gathered:
            merged.update(rank_shapes)
        keys = sorted(merged)
        scalars = [k for k in keys if merged[k] == 0]
        vectors = [k for k in keys if merged[k] > 0]
        add = torch.tensor([0.0 if k.endswith("_max") else float(self.values.get(k, 0.0)) for k in scalars],
                           dtype=torch.float64)  # type: ignore[arg-type]
        top = torch.tensor([float(self.values.get(k, 0.0)) if k.endswith("_max") else float("-inf")  # type: ignore[arg-type]
                            for k in scalars], dtype=torch.float64)
        flat = torch.cat([self._vector(k, merged[k]) for k in vectors]) if vectors else torch.zeros(0, dtype=torch.float64)
        if device.type == "cuda":
            add, top, flat = add.to(device), top.to(device), flat.to(device)
        dist.all_reduce(add, op=dist.ReduceOp.SUM)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        if vectors:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        out: dict[str, float | Tensor] = {k: float(top[i]) if k.endswith("_max") else float(add[i])
                                          for i, k in enumerate(scalars)}
        offset = 0
        for k in vectors:
            out[k] = flat[offset:offset + merged[k]].cpu()
            offset += merged[k]
        return out

    def _vector(self, key: str, size: int) -> Tensor:
        value = self.values.get(key)
        return value if isinstance(value, Tensor) else torch.zeros(size, dtype=torch.float64)
