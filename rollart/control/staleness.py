"""Bounded staleness as arithmetic, in one pure class (no clocks, no Ray, no I/O).

Versions: the initial weights are version 0; train step k trains batch k on the trainer's version k and
publishes version k + 1. So batch k is *trained at* version k.

Freshness. A trajectory whose behaviour version is v may be trained at version n only if

        n − v ≤ α                                                       (1)

where the behaviour version v is, by `rollout.staleness`:
- `trajectory` (the paper): the inference version when the trajectory was admitted (`start_version`);
- `token`: the oldest policy version among its generated tokens (`min_token_version`). A trajectory that
  has produced no token yet has no behaviour version and is never stale; every later token is at least as
  new, so this is the tightest statement of (1) about what was actually sampled.

Admission window. With the next batch to form being batch b and the inference workers serving version
n_inf, a trajectory admitted now (v = n_inf) can serve batches t with b ≤ t ≤ n_inf + α (by (1)), so

        window = clamp(n_inf + α + 1 − b, 0, batches_left)                (2)

batches; the scheduler keeps at most window × (groups per batch incl. redundancy) groups pending. Since
b ≥ n_inf always holds in the driver's loop, window ≤ α + 1, which bounds pending work by
(α + 1) × (batch size + redundancy). With α = 0 the window closes as soon as batch n_inf is taken and
reopens only after the new weights are served: the synchronous loop.

Cancellation. Once batch b is the next to form, a trajectory with v + α < b can serve no batch any more:
it is STALE and is cancelled as soon as that is seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rollart.types import Trajectory

StalenessMode = Literal["trajectory", "token"]


@dataclass(frozen=True)
class StalenessPolicy:
    alpha: int
    mode: StalenessMode = "trajectory"

    def __post_init__(self) -> None:
        if self.alpha < 0:
            raise ValueError(f"rollout.alpha must be ≥ 0, got {self.alpha}")
        if self.mode not in ("trajectory", "token"):
            raise ValueError(f"rollout.staleness must be 'trajectory' or 'token', got {self.mode!r}")

    def behaviour_version(self, trajectory: Trajectory) -> int | None:
        """v in (1); None when, in token mode, no token has been generated yet."""
        if self.mode == "trajectory":
            return trajectory.start_version
        versions = [v for t in trajectory.turns for v in t.versions]
        return min(versions) if versions else None

    def staleness(self, trajectory: Trajectory, train_version: int) -> int:
        """n − v (0 when there is no behaviour version yet)."""
        v = self.behaviour_version(trajectory)
        return 0 if v is None else train_version - v

    def is_fresh(self, trajectory: Trajectory, train_version: int) -> bool:
        """(1): may this trajectory be trained at `train_version`?"""
        return self.staleness(trajectory, train_version) <= self.alpha

    def version_is_fresh(self, behaviour_version: int | None, next_train_version: int) -> bool:
        """Can a trajectory with this behaviour version still serve batch `next_train_version` or a later one?"""
        return behaviour_version is None or behaviour_version + self.alpha >= next_train_version

    def admission_window(self, inference_version: int, next_train_version: int, batches_left: int) -> int:
        """(2): how many upcoming batches a trajectory admitted now could serve."""
        return max(0, min(inference_version + self.alpha + 1 - next_train_version, batches_left))
