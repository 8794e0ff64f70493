"""Trajectory advantages from scalar rewards: GRPO, RLOO and REINFORCE baselines (pure tensor functions).

In: `rewards` [N] (float) and `groups` [N] (long, any ids; trajectories with the same id share a prompt
seed — one GRPO group). Out: advantages [N], one per trajectory, broadcast over its tokens by the loss.

Formulas (g = the group of i, n_g its size, μ_g / σ_g the mean / population standard deviation of the
group's rewards, μ_B / σ_B the same over the whole batch, ε = 1e-6):

    GRPO       A_i = (r_i − μ_g) / (σ_g + ε)        (normalize_std)   |   r_i − μ_g       (otherwise)
    RLOO       A_i = (r_i − (Σ_g r − r_i)/(n_g − 1)) [/ (σ_g + ε)]    ;   A_i = 0 when n_g = 1
    REINFORCE  A_i = (r_i − μ_B) [/ (σ_B + ε)]     (a batch-mean baseline, REINFORCE++ style)

The population σ (not Bessel-corrected) keeps a group of one well defined: its advantage is 0. A group
whose rewards are all equal gets advantages 0 under GRPO and RLOO — it carries no signal.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

EPS = 1e-6
AdvantageKind = Literal["grpo", "rloo", "reinforce"]


def _group_stats(rewards: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-trajectory (group size, group sum, group population std), gathered back to [N]."""
    _, inverse = torch.unique(groups, return_inverse=True)
    k = int(inverse.max().item()) + 1 if inverse.numel() else 0
    r = rewards.to(torch.float64)  # sums of many rewards: keep the baseline exact
    count = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, r)
    mean = total / count
    var = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, (r - mean[inverse]) ** 2) / count
    return count[inverse], total[inverse], var.sqrt()[inverse]


def grpo_advantages(rewards: Tensor, groups: Tensor, normalize_std: bool = True) -> Tensor:
    """A_i = (r_i − μ_g) / (σ_g + ε), or r_i − μ_g without `normalize_std`."""
    count, total, std = _group_stats(rewards, groups)
    adv = rewards.to(torch.float64) - total / count
    if normalize_std:
        adv = adv / (std + EPS)
    return adv.to(rewards.dtype)


def rloo_advantages(rewards: Tensor, groups: Tensor, normalize_std: bool = False) -> Tensor:
    """A_i = r_i − mean of the other members of its group (0 for a group of one) [/ (σ_g + ε)]."""
    count, total, std = _group_stats(rewards, groups)
    r = rewards.to(torch.float64)
    others = torch.where(count > 1, (total - r) / (count - 1).clamp(min=1), r)
    adv = r - others
    if normalize_std:
        adv = adv / (std + EPS)
    return adv.to(rewards.dtype)


def reinforce_advantages(rewards: Tensor, normalize_std: bool = False) -> Tensor:
    """A_i = r_i − μ_B [/ (σ_B + ε)]: one baseline for the whole batch, groups ignored."""
    r = rewards.to(torch.float64)
    adv = r - r.mean()
    if normalize_std:
        adv = adv / (r.std(unbiased=False) + EPS)
    return adv.to(rewards.dtype)


def compute_advantages(
    rewards: Tensor, groups: Tensor, kind: AdvantageKind = "grpo", normalize_std: bool = True
) -> Tensor:
    """Dispatch on `train.advantage`; `normalize_std` is `train.normalize_std` for every kind."""
    if rewards.ndim != 1 or groups.shape != rewards.shape:
        raise ValueError(
            f"advantages need rewards [N] and groups [N]; got {tuple(rewards.shape)} and {tuple(groups.shape)}"
        )
    if kind == "grpo":
        return grpo_advantages(rewards, groups, normalize_std)
    if kind == "rloo":
        return rloo_advantages(rewards, groups, normalize_std)
    if kind == "reinforce":
        return reinforce_advantages(rewards, normalize_std)
    raise ValueError(f"train.advantage={kind!r} is not one of 'grpo', 'rloo', 'reinforce'")
