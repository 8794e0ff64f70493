"""DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): GRPO with four
changes, each a setting of its preset (`rollart.config.algorithm`):

- Clip-higher: ε_low = 0.2, ε_high = 0.28 (`train.clip_low`, `train.clip_high`).
- Dynamic sampling: a complete group whose rewards are all equal is dropped and a new group admitted in its
  place (`train.dynamic_sampling`; `filters.reward_variance`; bounded per batch by
  `train.max_filtered_groups`).
- Token-level policy-gradient loss: L = − Σ_t w_t·s_t / N_tok over the batch's tokens
  (`train.aggregation=token_mean`; TRL's `loss_type="dapo"`).
- Overlong reward shaping: with L_max a turn's max_new_tokens and L_cache = `train.overlong_buffer`·L_max,

      R_len(y) = 0                               |y| ≤ L_max − L_cache
               = ((L_max − L_cache) − |y|) / L_cache · overlong_penalty    L_max − L_cache < |y| ≤ L_max

  added to the reward (shaping.py; a multi-turn trajectory takes its worst turn). Overlong filtering
  (masking truncated samples) is `train.overlong_filter`.

The advantage and the surrogate are GRPO's (grpo.py).
"""

from __future__ import annotations

from rollart.algo import grpo
from rollart.algo.algorithm import Algorithm
from rollart.algo.filters import reward_variance

ALGORITHM = Algorithm("dapo", grpo.advantages, grpo.token_clip, reward_variance)
