"""GRPO (Shao et al. 2024, DeepSeekMath): a group-relative advantage and the token-level clipped surrogate.

In/out: the `Algorithm` parts (algorithm.py). With g the group of trajectory i, μ_g / σ_g the mean /
population std of its rewards and ε = 1e-6:

    A_i = (r_i − μ_g) / (σ_g + ε)        (train.normalize_std)   |   r_i − μ_g   (otherwise)
    r_t = exp(log π_θ − log π_prox)
    s_t = min(r_t·A, clip(r_t, 1 − ε_low, 1 + ε_high)·A)      (ε_low = clip_low, ε_high = clip_high)

The clipped branch is taken only when r_t has left the band in the direction the advantage pushes: r_t >
1 + ε_high with A > 0, or r_t < 1 − ε_low with A < 0. With rollart's defaults (seq_mean aggregation, the
behaviour correction token_tis, clip_high 0.28) this is TRL's `loss_type="grpo"` with clip-higher and
vLLM-style truncated importance sampling. A group whose rewards are all equal gets advantage 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rollart.algo.algorithm import Algorithm, SurrogateTerms
from rollart.algo.filters import reward_variance
from rollart.algo.stats import EPS, check_shapes, group_stats
from rollart.config import TrainConfig


def grpo_advantages(rewards: Tensor, groups: Tensor, normalize_std: bool = True) -> Tensor:
    """A_i = (r_i − μ_g) / (σ_g + ε), or r_i − μ_g without `normalize_std`."""
    count, total, std = group_stats(rewards, groups)
    adv = rewards.to(torch.float64) - total / count
    if normalize_std:
        adv = adv / (std + EPS)
    return adv.to(rewards.dtype)


def advantages(rewards: Tensor, groups: Tensor, tokens: Tensor, train: TrainConfig) -> Tensor:
    check_shapes(rewards, groups, tokens)
    return grpo_advantages(rewards, groups, train.normalize_std)


def token_clip(logprobs: Tensor, log_ratio: Tensor, advantages: Tensor, mask: Tensor, clip_low: float,
               clip_high: float) -> SurrogateTerms:
    """s_t = min(r_t·A, clip(r_t, 1 − clip_low, 1 + clip_high)·A) per token (PPO's clipped surrogate)."""
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return SurrogateTerms(torch.minimum(unclipped, clipped), clipped < unclipped, ratio.detach())


ALGORITHM = Algorithm("grpo", advantages, token_clip, reward_variance)
