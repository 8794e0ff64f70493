"""Group filters: which complete groups enter the batch while `train.dynamic_sampling` is on (DAPO).

In: a complete group's trajectories, scored. Out: None (keep) or the reason it is dropped — the scheduler
counts it (`rollout/groups_filtered/<domain>`), ends its trajectories in the ledger as filtered, and admits a
new group in its place.

`reward_variance`: a group whose rewards are all equal gets advantage 0 under every group baseline (GRPO,
RLOO, REINFORCE++'s group mean) — it costs a train step's compute and carries no gradient (Yu et al. 2025,
DAPO §3.2, "dynamic sampling"). Equal means within 1e-9 (rewards are floats from any reward function).
"""

from __future__ import annotations

from typing import Sequence

from rollart.types import Trajectory

TOLERANCE = 1e-9


def reward_variance(group: Sequence[Trajectory]) -> str | None:
    """Drop the group when its rewards do not vary."""
    rewards = [float(t.reward) for t in group if t.reward is not None]
    if len(rewards) < 2 or max(rewards) - min(rewards) > TOLERANCE:
        return None
    return f"no reward variance (every reward {rewards[0]:g})"
