"""The algorithm plane: RL algorithms as records of pure functions behind one registry, the shared loss, and
the scored-trajectories → TrainBatch step (docs/training.md has every algorithm's formulas).

The job builds batches with `build_train_batch`, hands the trainer a `PolicyObjective` (the registered
algorithm's loss bound to `train.*`) and the scheduler the algorithm's group filter; neither the trainer nor
the control plane imports this package (planes never import each other: docs/architecture.md §3).
"""

from rollart.algo.algorithm import Algorithm, SurrogateTerms
from rollart.algo.batch import build_train_batch
from rollart.algo.corrections import correction_weights, histogram_quantile, log_ratio_histogram
from rollart.algo.filters import reward_variance
from rollart.algo.grpo import grpo_advantages
from rollart.algo.losses import aggregation_weights, k3_kl, kl_penalty, policy_loss
from rollart.algo.objective import CriticObjective, PolicyObjective
from rollart.algo.ppo import gae, value_loss
from rollart.algo.registry import ALGORITHMS, algorithm_of
from rollart.algo.reinforce_pp import reinforce_pp_advantages
from rollart.algo.rloo import rloo_advantages
from rollart.algo.updates import mini_batch_plan

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "CriticObjective",
    "PolicyObjective",
    "SurrogateTerms",
    "aggregation_weights",
    "algorithm_of",
    "build_train_batch",
    "correction_weights",
    "gae",
    "grpo_advantages",
    "histogram_quantile",
    "k3_kl",
    "kl_penalty",
    "log_ratio_histogram",
    "mini_batch_plan",
    "policy_loss",
    "reinforce_pp_advantages",
    "reward_variance",
    "rloo_advantages",
    "value_loss",
]
