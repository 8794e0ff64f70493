"""Fakes that isolate the control plane's logic: a TrajectoryRunner whose episodes take chosen latencies
and fail when told, and a RewardScorer. The real env and reward planes have their own contract tests; here
the point is scheduling, staleness and bookkeeping, which these fakes exercise without Ray."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Callable

from rollart.types import RewardResult, Status, Task, Trajectory, Turn


@dataclass
class FakeRunner:
    version: Callable[[], int]  # the version the (fake) inference serves right now
    latency: Callable[[Task], float] = lambda task: 0.005
    fail: Callable[[Task], bool] = lambda task: False
    turns: int = 2
    tokens_per_turn: int = 3
    turn_barrier: object | None = None
    _cancel: dict[str, tuple[asyncio.Event, list]] = field(default_factory=dict)
    _tokens: dict[str, list[int]] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    cancelled: list[tuple[str, Status, str]] = field(default_factory=list)  # only those still running
    expected: list = field(default_factory=list)  # the forecasts (UpcomingGroup) the scheduler told it

    async def run(self, task: Task, start_version: int) -> Trajectory:
        self.runs.append(task.trajectory_id)
        event, why = asyncio.Event(), []
        self._cancel[task.trajectory_id] = (event, why)
        self._tokens[task.trajectory_id] = []
        traj = Trajectory(task.trajectory_id, task, start_version)
        try:
            for k in range(self.turns):
                if self.turn_barrier is not None:
                    await self.turn_barrier.before_turn(task.trajectory_id, k)
                try:
                    await asyncio.wait_for(event.wait(), timeout=self.latency(task) / self.turns)
                except asyncio.TimeoutError:
                    pass
                if why:
                    return traj.finished(why[0], why[1])
                v = self.version()
                self._tokens[task.trajectory_id].append(v)
                n = self.tokens_per_turn
                traj = traj.with_turn(Turn((1, 2), tuple(range(n)), (-0.5,) * n, (v,) * n))
                if self.fail(task) and k == self.turns - 1:
                    return traj.finished(Status.FAILED, "injected env failure")
            return traj.finished(Status.COMPLETED)
        finally:
            self._cancel.pop(task.trajectory_id, None)
            self._tokens.pop(task.trajectory_id, None)
            if self.turn_barrier is not None:
                await self.turn_barrier.leave(task.trajectory_id)

    async def cancel(self, trajectory_id: str, status: Status, reason: str) -> None:
        if trajectory_id in self._cancel:
            self.cancelled.append((trajectory_id, status, reason))
            event, why = self._cancel[trajectory_id]
            if not why:
                why.extend([status, reason])
            event.set()

    async def progress(self) -> dict[str, int | None]:
        return {tid: (min(v) if v else None) for tid, v in self._tokens.items()}

    async def expect(self, group) -> None:
        self.expected.append(group)


@dataclass
class FakeScorer:
    fail_prob: float = 0.0
    seed: int = 0
    scored: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    async def score(self, trajectory: Trajectory) -> RewardResult:
        self.scored.append(trajectory.trajectory_id)
        await asyncio.sleep(0)
        if self.rng.random() < self.fail_prob:
            return RewardResult(trajectory.trajectory_id, 0.0, ok=False, error="injected", attempts=3)
        reward = float((trajectory.task.seed + int(trajectory.trajectory_id.split("/")[-1])) % 2)
        return RewardResult(trajectory.trajectory_id, reward)
