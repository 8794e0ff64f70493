"""Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"): GRPO without
its two biases — no division by the group's std (question-difficulty bias) and no division by each
response's own length (length bias).

In/out: GRPO's parts (grpo.py); the difference is in the preset (`rollart.config.algorithm`):

    A_i = r_i − μ_g                                   (train.normalize_std=false)
    L   = − Σ_i Σ_t w_t·s_t / (N_seq · L_max)         (train.aggregation=seq_sum_norm)

with L_max a constant (`train.norm_length`; 0 = the longest generation budget of a trained domain,
max_turns × max_new_tokens) instead of |o_i|. This is TRL's `loss_type="dr_grpo"` (its L_max is
`max_completion_length`) with `scale_rewards="none"`.
"""

from __future__ import annotations

from rollart.algo import grpo
from rollart.algo.algorithm import Algorithm
from rollart.algo.filters import reward_variance

ALGORITHM = Algorithm("dr_grpo", grpo.advantages, grpo.token_clip, reward_variance)
