"""Scored trajectories → the trainer's `TrainBatch`, with advantages computed per GRPO group.

In: `Trajectory` records whose reward is set (scored by the reward plane) and whose status is trainable
(COMPLETED or TRUNCATED), the policy version the batch trains (the trainer's current version) and
`TrainConfig` (`advantage`, `normalize_std`). Out: a `TrainBatch` whose samples keep the trajectories'
order and carry exactly the token ids, loss mask, behaviour logprobs and per-token versions that were
generated (token-in/token-out: nothing is re-tokenised). A trajectory of several segments (an agent that
rewrote its history) gives one sample per segment, each with the trajectory's advantage.

Guarantees: groups are keyed by `Trajectory.group_id`, so a batch holding several domains (each with its
own groups) is handled in one call; a trajectory without a reward or with an untrainable status is an error
naming it, never silently dropped (that is the buffer's job, where it is counted).
"""

from __future__ import annotations

from typing import Sequence

import torch

from rollart.algo.advantages import compute_advantages
from rollart.config import TrainConfig
from rollart.types import TrainBatch, TrainSample, Trajectory


def build_train_batch(trajectories: Sequence[Trajectory], version: int, cfg: TrainConfig) -> TrainBatch:
    """One `TrainSample` per trajectory segment, advantage from its group's rewards (`compute_advantages`)."""
    if not trajectories:
        raise ValueError("build_train_batch: no trajectories (a batch needs at least one)")
    for t in trajectories:
        if t.reward is None:
            raise ValueError(f"trajectory {t.trajectory_id}: reward is not set (score it before training)")
        if t.status is None or not t.status.trainable:
            raise ValueError(
                f"trajectory {t.trajectory_id}: status {t.status} is not trainable (COMPLETED or TRUNCATED)"
            )
        if t.num_response_tokens == 0:
            raise ValueError(f"trajectory {t.trajectory_id}: no generated tokens to train on")
    group_index = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
    rewards = torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float64)
    groups = torch.tensor([group_index[t.group_id] for t in trajectories], dtype=torch.long)
    advantages = compute_advantages(rewards, groups, cfg.advantage, cfg.normalize_std).tolist()
    samples = tuple(
        TrainSample(
            trajectory_id=t.trajectory_id,
            group_id=t.group_id,
            domain=t.domain,
            token_ids=tuple(part.token_ids()),
            loss_mask=tuple(part.loss_mask()),
            behaviour_logprobs=tuple(part.behaviour_logprobs()),
            token_versions=tuple(part.token_versions()),
            advantage=float(a),
            reward=float(t.reward),
        )
        for t, a in zip(trajectories, advantages)
        for part in t.segments()
        if part.num_response_tokens
    )
    return TrainBatch(version=version, samples=samples)
