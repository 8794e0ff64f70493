"""CISPO (MiniMax 2025, "MiniMax-M1", §3.1): clip the importance weight, never the token — every token keeps
its gradient, scaled by a stop-gradient, clipped ratio:

    r_t = exp(log π_θ − log π_prox)
    J   = Σ_t sg(clip(r_t, 1 − ε_low, 1 + ε_high)) · A · log π_θ(t)      / N_tok

so ∇J = Σ_t clip(r_t)·A·∇log π_θ(t): PPO's clip would zero the gradient of a token outside the band (often
the rare "fork" tokens reasoning hinges on); CISPO only caps its weight. Preset: no lower bound
(`clip_low=1`: the weight's floor is 0), `clip_high=4` (the cap 1 + 4 = 5, ScaleRL's ε_max and TRL's
recommendation), token-level aggregation. This is TRL's `loss_type="cispo"` with `epsilon_high = 1 +
clip_high`. The behaviour correction w_t multiplies the term like any other.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rollart.algo import grpo
from rollart.algo.algorithm import Algorithm, SurrogateTerms
from rollart.algo.filters import reward_variance


def clipped_weight(logprobs: Tensor, log_ratio: Tensor, advantages: Tensor, mask: Tensor, clip_low: float,
                   clip_high: float) -> SurrogateTerms:
    """sg(clip(r_t, 1 − clip_low, 1 + clip_high))·A·log π_θ(t); a token counts as clipped when its weight was."""
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high).detach()
    clipped = ((ratio > 1.0 + clip_high) & (advantages > 0)) | ((ratio < 1.0 - clip_low) & (advantages < 0))
    objective = weight * advantages * torch.where(mask.bool(), logprobs, torch.zeros_like(logprobs))
    return SurrogateTerms(objective, clipped, ratio.detach())


ALGORITHM = Algorithm("cispo", grpo.advantages, clipped_weight, reward_variance)
