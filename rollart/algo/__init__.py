"""Advantages and losses as pure tensor functions, and the scored-trajectories → TrainBatch step.

The driver builds batches with `build_train_batch` and hands the trainer a `PolicyObjective` (the loss
bound to `train.*`); the trainer never imports this package (planes never import each other: docs/architecture.md §3).
"""

from rollart.algo.advantages import (
    compute_advantages,
    grpo_advantages,
    reinforce_advantages,
    rloo_advantages,
)
from rollart.algo.batch import build_train_batch
from rollart.algo.losses import PolicyObjective, aggregation_weights, k3_kl, policy_loss
from rollart.algo.updates import mini_batch_plan

__all__ = [
    "PolicyObjective",
    "aggregation_weights",
    "build_train_batch",
    "compute_advantages",
    "grpo_advantages",
    "k3_kl",
    "mini_batch_plan",
    "policy_loss",
    "reinforce_advantages",
    "rloo_advantages",
]
