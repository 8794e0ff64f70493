"""`PolicyObjective`: the registered algorithm's loss bound to the `train.*` settings — what the job hands the
trainer (the trainer's `Objective` protocol, rollart/trainer/objective.py) — and `CriticObjective`, its value
model's part when the algorithm has one.

In: a `RunConfig` (`PolicyObjective.of`): `train.algorithm` picks the `Algorithm` (registry.py), the other
`train.*` settings bind its surrogate and the shared loss (losses.py); the trained domains' generation
budgets fix Dr.GRPO's constant length when `train.norm_length` is 0. Out: per batch `update_plan`, per
micro-batch `token_weights` and the loss (`__call__`), per step `summarize` (the summed statistics → the
`train/*` metrics of the algorithm: clip fraction, importance weights and their quantiles, the mismatch KL …).

Guarantee: with `train.algorithm=grpo` and the defaults, the loss is bit for bit the one rollart trained with
before algorithms were pluggable (token clip, token_tis, seq_mean, k3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from torch import Tensor

from rollart.algo import ppo
from rollart.algo.algorithm import Algorithm
from rollart.algo.corrections import Correction, histogram_quantile
from rollart.algo.losses import Aggregation, KlEstimator, aggregation_weights, policy_loss
from rollart.algo.registry import algorithm_of
from rollart.algo.updates import mini_batch_plan
from rollart.config import RunConfig

QUANTILES = {"p01": 0.01, "p50": 0.5, "p99": 0.99}


@dataclass(frozen=True)
class CriticObjective:
    """The critic's part of an algorithm with a value model: GAE and the clipped value loss (ppo.py), bound to
    `train.critic.*` and `train.normalize_std` (whiten the advantages over the batch)."""

    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float = 0.2
    lr: float = 1e-3
    grad_clip: float = 1.0
    path: str = ""
    whiten: bool = True

    def advantages(self, values: Tensor, rewards: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return ppo.gae(values, rewards, mask, self.gamma, self.lam)

    def loss(self, values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, weights: Tensor
             ) -> tuple[Tensor, dict[str, Tensor]]:
        return ppo.value_loss(values, old_values, returns, mask, weights, self.value_clip)


@dataclass(frozen=True)
class PolicyObjective:
    algorithm: Algorithm
    clip_low: float = 0.2
    clip_high: float = 0.28
    correction: Correction = "token_tis"
    tis_cap: float = 2.0
    tis_floor: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: KlEstimator = "k3"
    aggregation: Aggregation = "seq_mean"
    norm_length: float = 1.0
    mini_batches: int = 1
    epochs: int = 1
    critic: CriticObjective | None = None

    @classmethod
    def of(cls, cfg: RunConfig) -> PolicyObjective:
        train = cfg.train
        algorithm = algorithm_of(train)
        critic = None
        if algorithm.critic:
            c = train.critic
            critic = CriticObjective(c.gamma, c.lam, c.value_clip, c.lr, c.grad_clip, c.path, train.normalize_std)
        return cls(algorithm, train.clip_low, train.clip_high, train.correction, train.tis_cap, train.tis_floor,
                   train.kl_coef, train.kl_estimator, train.aggregation, float(norm_length(cfg)),
                   train.mini_batches, train.epochs, critic)

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0

    def update_plan(self, num_samples: int, seed: str) -> list[tuple[int, ...]]:
        return mini_batch_plan(num_samples, self.mini_batches, self.epochs, seed)

    def token_weights(self, mask: Tensor, total_tokens: float, total_seqs: float) -> Tensor:
        return aggregation_weights(mask, self.aggregation, total_tokens, total_seqs, self.norm_length)

    def __call__(self, logprobs: Tensor, behaviour_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                 weights: Tensor, proximal_logprobs: Tensor | None = None, ref_logprobs: Tensor | None = None,
                 fresh: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        return policy_loss(
            logprobs, behaviour_logprobs, advantages, mask, weights,
            clip_low=self.clip_low, clip_high=self.clip_high, tis_cap=self.tis_cap, tis_floor=self.tis_floor,
            correction=self.correction, surrogate=self.algorithm.surrogate, proximal_logprobs=proximal_logprobs,
            ref_logprobs=ref_logprobs, kl_coef=self.kl_coef, kl_estimator=self.kl_estimator, fresh=fresh,
        )

    def summarize(self, sums: Mapping[str, float | Tensor], steps: int) -> dict[str, float]:
        """The algorithm's `train/*` metrics from the statistics summed over a train step's optimizer steps,
        micro-batches and ranks (`policy_loss`, and the critic's `value_loss`)."""
        def get(key: str) -> float:
            value = sums.get(key, 0.0)
            return float(value) if not isinstance(value, Tensor) else float(value.sum())

        n = max(get("tokens"), 1.0)
        out = {
            "train/pg_loss": get("pg_loss") / steps,
            "train/clip_frac": get("clipped") / n,
            "train/ratio_max": get("ratio_max"),
            "train/iw_mean": get("iw_sum") / n,
            "train/iw_max": get("iw_max"),
            "train/iw_truncated_frac": get("iw_truncated") / n,
            "train/iw_masked_frac": get("iw_masked") / n,
            "train/approx_kl": get("approx_kl_sum") / n,
            "train/behaviour_kl": get("behaviour_kl_sum") / n,
        }
        fresh = get("mismatch_tokens")
        if fresh > 0:  # no token of the trained version: the engine-vs-trainer gap is not measured this step
            out["train/mismatch_kl"] = get("mismatch_kl_sum") / fresh
        hist = sums.get("iw_hist")
        if isinstance(hist, Tensor):
            for name, q in QUANTILES.items():
                value = histogram_quantile(hist, q)
                if not math.isnan(value):
                    out[f"train/iw_{name}"] = value
        if self.uses_reference:
            out["train/ref_kl"] = get("ref_kl_sum") / n
            out["train/kl_loss"] = get("kl_loss") / steps
        if self.critic is not None:
            out["train/value_loss"] = get("value_loss") / steps
            out["train/value_mean"] = get("value_sum") / n
            out["train/value_error"] = get("value_error_sum") / n
            out["train/value_clip_frac"] = get("value_clipped") / n
        return out


def norm_length(cfg: RunConfig) -> int:
    """Dr.GRPO's constant L: `train.norm_length`, or the longest generation budget of a trained domain
    (max_turns × max_new_tokens, capped by its max_total_tokens)."""
    if cfg.train.norm_length:
        return cfg.train.norm_length
    budgets = [min(d.max_turns * d.max_new_tokens, d.max_total_tokens)
               for d in cfg.domains.values() if d.weight > 0]
    return max(budgets, default=1)
