"""RLOO (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization"):
REINFORCE with the leave-one-out mean of the other samples of the same prompt as the baseline, the whole
completion as one action.

    A_i = r_i − (1/(k−1)) Σ_{j≠i} r_j          (k = the group's size; A_i = 0 when k = 1)
    J   = (1/N_seq) Σ_i Σ_t w_t·s_t             (train.aggregation=seq_sum: Σ_t log π = log π(y_i))

with GRPO's token surrogate s_t (its gradient at the proximal point is A_i·∇log π_θ(y_i)) and no std
normalisation (preset `normalize_std=false`; with it, A_i / (σ_g + ε)). TRL's `RLOOTrainer` clips the
*sequence* ratio exp(Σ_t Δ_t) instead; both are the paper's on-policy gradient at r = 1, which is what
rollart's default (one optimizer step per batch) trains.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rollart.algo import grpo
from rollart.algo.algorithm import Algorithm
from rollart.algo.filters import reward_variance
from rollart.algo.stats import EPS, check_shapes, group_stats
from rollart.config import TrainConfig


def rloo_advantages(rewards: Tensor, groups: Tensor, normalize_std: bool = False) -> Tensor:
    """A_i = r_i − mean of the other members of its group (0 for a group of one) [/ (σ_g + ε)]."""
    count, total, std = group_stats(rewards, groups)
    r = rewards.to(torch.float64)
    others = torch.where(count > 1, (total - r) / (count - 1).clamp(min=1), r)
    adv = r - others
    if normalize_std:
        adv = adv / (std + EPS)
    return adv.to(rewards.dtype)


def advantages(rewards: Tensor, groups: Tensor, tokens: Tensor, train: TrainConfig) -> Tensor:
    check_shapes(rewards, groups, tokens)
    return rloo_advantages(rewards, groups, train.normalize_std)


ALGORITHM = Algorithm("rloo", advantages, grpo.token_clip, reward_variance)
