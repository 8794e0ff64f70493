"""The `Algorithm` record: what an RL algorithm decides, as three pure functions and a flag.

In: nothing (types only). Out: `Algorithm`, and the shapes of its parts:

- `AdvantageFn(rewards [N], groups [N], tokens [N], train) -> advantages [N]`: one advantage per trajectory
  from the scalar rewards (float64), the group ids (long; same id = same prompt seed) and each trajectory's
  model-token count; `train` carries the settings (`normalize_std` …). None for an algorithm whose
  advantages come from a critic (per token, in the trainer: `ppo`).
- `Surrogate(logprobs, log_ratio, advantages, mask, clip_low, clip_high) -> SurrogateTerms`: the per-token
  objective s_t to *maximise* (the loss multiplies it by −w_t, the behaviour correction, and aggregates; see
  losses.py), which tokens took a clipped branch, and the ratio it used. `log_ratio` = log π_θ − log π_prox,
  0 off the mask; `advantages` [B, 1] or [B, T].
- `GroupFilter(group) -> reason | None`: asked about each complete group (its trajectories, scored) while
  `train.dynamic_sampling` is on: a reason drops the group (it is counted and replaced), None keeps it.

An algorithm is one module in this package that builds its `Algorithm` from these parts (its own, or the
shared ones: `grpo.token_clip`, `filters.reward_variance`), plus one line in `registry.py`. Its *settings*
are `train.*` keys with a preset per name (`rollart.config.algorithm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

from torch import Tensor

from rollart.types import Trajectory

if TYPE_CHECKING:
    from rollart.config import TrainConfig


class SurrogateTerms(NamedTuple):
    objective: Tensor  # s_t [B, T]: what the update maximises per token (before the correction w_t)
    clipped: Tensor  # [B, T] bool: the token's clipped branch was taken (its gradient is cut or capped)
    ratio: Tensor  # [B, T] (detached): the ratio the surrogate used (token or sequence level)


AdvantageFn = Callable[[Tensor, Tensor, Tensor, "TrainConfig"], Tensor]
Surrogate = Callable[[Tensor, Tensor, Tensor, Tensor, float, float], SurrogateTerms]
GroupFilter = Callable[[Sequence[Trajectory]], "str | None"]


@dataclass(frozen=True)
class Algorithm:
    name: str
    advantages: AdvantageFn | None  # None: per-token advantages from the critic (GAE)
    surrogate: Surrogate
    group_filter: GroupFilter  # applied while train.dynamic_sampling is on
    critic: bool = False  # a value model trains beside the policy

    def filter_for(self, train: TrainConfig) -> GroupFilter | None:
        """The filter the scheduler asks about each complete group under these settings (None: keep all)."""
        return self.group_filter if train.dynamic_sampling else None
