"""Group and batch statistics of scalar rewards, shared by the advantage estimators (pure tensor functions).

In: values [N] and group ids [N] (long, any ids). Out: per-element group size, group sum and the group's
population standard deviation (`group_stats`), gathered back to [N]; a weighted mean and population std
(`weighted_moments`). Sums run in float64: a baseline over many rewards stays exact.

The population σ (not Bessel-corrected) keeps a group of one well defined: its advantage is 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

EPS = 1e-6


def group_stats(values: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per element (group size, group sum, group population std), gathered back to [N]."""
    _, inverse = torch.unique(groups, return_inverse=True)
    k = int(inverse.max().item()) + 1 if inverse.numel() else 0
    r = values.to(torch.float64)
    count = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, r)
    mean = total / count
    var = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, (r - mean[inverse]) ** 2) / count
    return count[inverse], total[inverse], var.sqrt()[inverse]


def weighted_moments(values: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, population std) of `values` with non-negative `weights` (e.g. token counts), in float64."""
    v, w = values.to(torch.float64), weights.to(torch.float64)
    total = w.sum().clamp(min=1e-12)
    mean = (w * v).sum() / total
    return mean, ((w * (v - mean) ** 2).sum() / total).sqrt()


def check_shapes(rewards: Tensor, groups: Tensor, tokens: Tensor) -> None:
    if rewards.ndim != 1 or groups.shape != rewards.shape or tokens.shape != rewards.shape:
        raise ValueError(f"advantages need rewards [N], groups [N] and tokens [N]; got {tuple(rewards.shape)}, "
                         f"{tuple(groups.shape)} and {tuple(tokens.shape)}")
