"""REINFORCE++ (Hu et al. 2025, "REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global
Advantage Normalization"), in its group-sampling form (REINFORCE++-baseline): subtract the group's mean
reward — a prompt's own baseline — then normalise with the *batch's* statistics, not the group's:

    A'_i = r_i − μ_g
    A_i  = (A'_i − mean_B(A')) / (std_B(A') + ε)          (train.normalize_std; else A'_i)

where mean_B / std_B run over the batch's tokens (each trajectory weighs by its model-token count, as the
paper's token-level whitening does: OpenRLHF's `reinforce_baseline`). The global std keeps a low-variance
group from being blown up to unit scale (what GRPO's per-group σ does), the source of its stability. The
KL to the reference is a loss term with the k2 estimator (preset `kl_estimator=k2`, used when
`train.kl_coef` > 0) instead of a per-token reward; the surrogate is PPO's token clip.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rollart.algo import grpo
from rollart.algo.algorithm import Algorithm
from rollart.algo.filters import reward_variance
from rollart.algo.stats import EPS, check_shapes, group_stats, weighted_moments
from rollart.config import TrainConfig


def reinforce_pp_advantages(rewards: Tensor, groups: Tensor, tokens: Tensor, normalize_std: bool = True) -> Tensor:
    """A_i = (r_i − μ_g − mean_B) / (std_B + ε), the batch moments weighted by each trajectory's tokens."""
    count, total, _ = group_stats(rewards, groups)
    centred = rewards.to(torch.float64) - total / count
    if not normalize_std:
        return centred.to(rewards.dtype)
    mean, std = weighted_moments(centred, tokens)
    return ((centred - mean) / (std + EPS)).to(rewards.dtype)


def advantages(rewards: Tensor, groups: Tensor, tokens: Tensor, train: TrainConfig) -> Tensor:
    check_shapes(rewards, groups, tokens)
    return reinforce_pp_advantages(rewards, groups, tokens, train.normalize_std)


ALGORITHM = Algorithm("reinforce_pp", advantages, grpo.token_clip, reward_variance)
