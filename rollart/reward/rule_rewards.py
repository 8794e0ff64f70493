"""Built-in rule rewards that read only what the environment recorded. Pure and cheap: awaited inline.

- `env`: the environment's own return (`Trajectory.env_return`, the sum of its per-step rewards), with
  the per-step rewards as per-turn scores.
- `format`: did every turn's action follow the domain's action format? In: the turns' `format_ok` (set
  by the env plane when it parsed the action). Out: the fraction of well-formed turns, per turn 1.0/0.0;
  a trajectory with no turns scores 0.0.
"""

from __future__ import annotations

from rollart.reward.protocol import RewardOutput
from rollart.types import Trajectory


async def format_reward(trajectory: Trajectory) -> RewardOutput:
    per_turn = tuple(1.0 if t.format_ok else 0.0 for t in trajectory.turns)
    score = sum(per_turn) / len(per_turn) if per_turn else 0.0
    return RewardOutput(score, per_turn=per_turn, details={"well_formed_turns": int(sum(per_turn))})


async def env_reward(trajectory: Trajectory) -> RewardOutput:
    """`env`: the environment's own return (the sum of its per-step rewards), with per-turn rewards."""
    return RewardOutput(trajectory.env_return, per_turn=tuple(t.reward for t in trajectory.turns))
