"""The twin's trainer and weight movement.

`SimTrainer` (the trainer ranks' surface the driver uses: `version`, `extra_state`, `names`,
`train_step`, `save_checkpoint`): a train step on a batch takes `TrainerCost.step_s(tokens)` of virtual
time — twice that with a critic (`critic=True`, train.algorithm=ppo: a second model of the same size runs a
forward for the values and its own forward and backward; reported as `time/critic`, the half it adds) — then
publishes version + 1 to the `WeightChannel`.

`WeightChannel` times the path from the trainer to each inference engine (costs.py `WeightSyncCost`):
- overlapped: publishing starts when the train step ends; every engine's pull is done at publish + one
  transfer + one bucket, so at the next sync an engine waits only for what is not done yet, then swaps;
- naive: nothing moves in the background; at the sync, engine i waits for the push and for its turn among
  `naive_streams` sends: the slowest engine exposes push + ⌈engines / streams⌉ transfers + swap.
`pull_wait(version, engine, now)` → (seconds the engine still waits, its pull's duration).
"""

from __future__ import annotations

import asyncio
from math import ceil
from typing import Any, Sequence

from rollart.sim.costs import TrainerCost, WeightSyncCost
from rollart.types import Trajectory


class WeightChannel:
    def __init__(self, cost: WeightSyncCost) -> None:
        self.cost = cost
        self.swap_s = cost.spec.swap_s
        self.published: dict[int, float] = {0: float("-inf")}  # version → time its publishing began
        self.sync_started: dict[int, float] = {}

    def publish(self, version: int, now: float) -> None:
        self.published[version] = now

    def pull_wait(self, version: int, engine: int, now: float) -> tuple[float, float]:
        cost, transfer = self.cost, self.cost.transfer_s
        if not cost.spec.overlap:
            turn = ceil((engine + 1) / cost.spec.naive_streams)
            return transfer + turn * transfer, turn * transfer
        begun = self.published.get(version)
        if begun is None or begun == float("-inf"):
            return 0.0, 0.0
        return max(0.0, begun + transfer + cost.bucket_s - now), transfer


class SimTrainer:
    def __init__(self, cost: TrainerCost, weights: WeightChannel, version: int = 0, critic: bool = False) -> None:
        self.cost, self.weights, self.critic = cost, weights, critic
        self.version = version
        self.extra_state: dict[str, Any] = {}
        self.names = [f"trainer/sim/{i}" for i in range(cost.gpus)][:1]
        self.busy_s = 0.0
        self.steps = 0
        self.tokens = 0

    async def train_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        tokens = int(sum(t.metrics.get("total_tokens", 0.0) for t in trajectories))
        policy_s = self.cost.step_s(tokens)
        seconds = 2 * policy_s if self.critic else policy_s
        await asyncio.sleep(seconds)
        self.busy_s += seconds
        self.steps += 1
        self.tokens += tokens
        self.version += 1
        self.weights.publish(self.version, asyncio.get_running_loop().time())
        metrics = {"train/tokens": float(tokens), "time/train_step": seconds}
        if self.critic:
            metrics["time/critic"] = seconds - policy_s
        return metrics

    def save_checkpoint(self, state: Any) -> None:
        """The twin keeps no weights: a checkpoint is only its run state."""
        self.extra_state = dict(state)
