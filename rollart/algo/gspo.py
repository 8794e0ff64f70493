"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the importance ratio and its clip are
taken per sequence, not per token — the length-normalised (geometric-mean) sequence ratio

    s_i(θ) = exp( (1/|y_i|) Σ_t (log π_θ(y_i,t) − log π_prox(y_i,t)) )
    J      = (1/G) Σ_i min(s_i·A_i, clip(s_i, 1 − ε_low, 1 + ε_high)·A_i)

with GRPO's group advantage, ε_low = 3e-4 and ε_high = 4e-4 (the paper's; a sequence ratio moves far less
than a token's) and one term per sequence (`train.aggregation=seq_mean`). Its gradient is A_i·s_i·(1/|y_i|)
Σ_t ∇log π_θ: every token of a sequence shares one weight, the reason it is stable for MoE models whose
per-token ratios are noisy. This is TRL's `importance_sampling_level="sequence"` with `loss_type="grpo"`.

The behaviour correction w_t still multiplies each token's term (TRL does the same); `train.correction=
seq_tis | seq_mis` weighs the whole sequence instead, which is the consistent choice for this algorithm.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rollart.algo import grpo
from rollart.algo.algorithm import Algorithm, SurrogateTerms
from rollart.algo.filters import reward_variance


def sequence_clip(logprobs: Tensor, log_ratio: Tensor, advantages: Tensor, mask: Tensor, clip_low: float,
                  clip_high: float) -> SurrogateTerms:
    """min(s_i·A, clip(s_i)·A) for every token of sequence i, s_i its length-normalised sequence ratio."""
    m = mask.to(log_ratio.dtype)
    log_s = (log_ratio * m).sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp(min=1.0)
    s = torch.exp(log_s)  # [B, 1]
    unclipped = s * advantages
    clipped = torch.clamp(s, 1.0 - clip_low, 1.0 + clip_high) * advantages
    objective = torch.minimum(unclipped, clipped).expand_as(log_ratio)
    return SurrogateTerms(objective, (clipped < unclipped).expand_as(log_ratio), s.detach().expand_as(log_ratio))


ALGORITHM = Algorithm("gspo", grpo.advantages, sequence_clip, reward_variance)
