"""Scored trajectories → the trainer's `TrainBatch`: the algorithm's advantages per group, after the length
shaping and masking the settings ask for.

In: `Trajectory` records whose reward is set (scored by the reward plane) and whose status is trainable
(COMPLETED or TRUNCATED), the policy version the batch trains (the trainer's current version), the
`TrainConfig` (`algorithm`, `normalize_std`, `overlong_*`) and each domain's `max_new_tokens` (the turn limit
the overlong shaping measures against; needed only when it is on). Out: a `TrainBatch` whose samples keep the
trajectories' order and carry exactly the token ids, loss mask, behaviour logprobs and per-token versions
that were generated (token-in/token-out: nothing is re-tokenised). A trajectory of several segments (an agent
that rewrote its history) gives one sample per segment, each with the trajectory's advantage.

Steps: (1) reward r_i += the overlong penalty (shaping.py; `train.overlong_buffer` > 0); (2) advantages from
the shaped rewards by the algorithm's estimator (0 for a critic's algorithm: the trainer computes GAE from
`TrainSample.reward`, the shaped reward); (3) under `train.overlong_filter`, a trajectory that was cut keeps
its place in its group's statistics but its loss mask is zeroed — unless that would leave the batch without a
token to train, in which case the batch trains with advantage 0 (a warning says so).

Guarantees: groups are keyed by `Trajectory.group_id`, so a batch holding several domains (each with its
own groups) is handled in one call; a trajectory without a reward or with an untrainable status is an error
naming it, never silently dropped (that is the buffer's job, where it is counted).
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import torch

from rollart.algo.registry import algorithm_of
from rollart.algo.shaping import overlong_penalty, was_cut
from rollart.config import TrainConfig
from rollart.types import TrainBatch, TrainSample, Trajectory

log = logging.getLogger("rollart.algo")


def build_train_batch(trajectories: Sequence[Trajectory], version: int, cfg: TrainConfig,
                      max_new_tokens: Mapping[str, int] | None = None) -> TrainBatch:
    """One `TrainSample` per trajectory segment (module docstring)."""
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
    rewards = [float(t.reward) for t in trajectories]  # type: ignore[arg-type]
    if cfg.overlong_buffer > 0:
        limits = max_new_tokens or {}
        missing = sorted({t.domain for t in trajectories} - set(limits))
        if missing:
            raise ValueError(f"train.overlong_buffer needs each domain's max_new_tokens; none given for {missing}")
        rewards = [r + overlong_penalty(t, limits[t.domain], cfg.overlong_buffer, cfg.overlong_penalty)
                   for r, t in zip(rewards, trajectories)]
    algorithm = algorithm_of(cfg)
    if algorithm.advantages is None:
        advantages = [0.0] * len(trajectories)
    else:
        group_index = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
        groups = torch.tensor([group_index[t.group_id] for t in trajectories], dtype=torch.long)
        tokens = torch.tensor([float(t.num_response_tokens) for t in trajectories], dtype=torch.float64)
        advantages = algorithm.advantages(torch.tensor(rewards, dtype=torch.float64), groups, tokens, cfg).tolist()
    masked = [cfg.overlong_filter and was_cut(t) for t in trajectories]
    if all(masked):
        log.warning("train.overlong_filter: every trajectory of batch %d was cut; it trains with advantage 0", version)
        advantages, masked = [0.0] * len(trajectories), [False] * len(trajectories)
    samples = tuple(
        TrainSample(
            trajectory_id=t.trajectory_id,
            group_id=t.group_id,
            domain=t.domain,
            token_ids=tuple(part.token_ids()),
            loss_mask=tuple(0 for _ in part.loss_mask()) if cut else tuple(part.loss_mask()),
            behaviour_logprobs=tuple(part.behaviour_logprobs()),
            token_versions=tuple(part.token_versions()),
            advantage=float(a),
            reward=r,
        )
        for t, a, r, cut in zip(trajectories, advantages, rewards, masked)
        for part in t.segments()
        if part.num_response_tokens
    )
    return TrainBatch(version=version, samples=samples)
