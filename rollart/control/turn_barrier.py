"""The turn barrier of the batch-synchronous baselines (`rollout.barrier=turn`).

In: cohort membership from the scheduler (`join(trajectory_id, cohort)`), and from each EnvManager
`before_turn(trajectory_id, k)` before turn k's generation and `leave(trajectory_id)` when it ends.
Out: `before_turn` returns once every member of the trajectory's cohort has reached turn k or left — the
lock-step advance of monolithic systems, where the slowest environment holds every trajectory at each turn.

With `rollout.barrier=none` (rollart's default) there is no barrier at all: trajectories advance on their
own. The class is plain asyncio; the driver runs it as a Ray actor (`ray.remote(LocalTurnBarrier)`) and env
workers reach it through `ActorTurnBarrier`.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict


class LocalTurnBarrier:
    def __init__(self, timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self._cohort: dict[str, int] = {}
        self._turn: dict[str, int] = {}  # the turn each member has arrived at (-1: not yet)
        self._members: dict[int, set[str]] = defaultdict(set)
        self._changed = asyncio.Condition()

    async def join(self, trajectory_id: str, cohort: int) -> None:
        async with self._changed:
            self._cohort[trajectory_id] = cohort
            self._turn[trajectory_id] = -1
            self._members[cohort].add(trajectory_id)

    async def before_turn(self, trajectory_id: str, turn_index: int) -> None:
        if trajectory_id not in self._cohort:
            return  # not under a barrier (e.g. an evaluation episode)
        cohort = self._cohort[trajectory_id]
        async with self._changed:
            self._turn[trajectory_id] = turn_index
            self._changed.notify_all()
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._all_arrived(cohort, turn_index)), self.timeout_s
                )
            except asyncio.TimeoutError:
                late = sorted(m for m in self._members[cohort] if self._turn[m] < turn_index)
                raise TimeoutError(
                    f"turn barrier: {trajectory_id} waited {self.timeout_s:.0f}s at turn {turn_index} for "
                    f"{len(late)} trajectories of cohort {cohort} ({late[:5]}…)"
                ) from None

    async def leave(self, trajectory_id: str) -> None:
        async with self._changed:
            cohort = self._cohort.pop(trajectory_id, None)
            self._turn.pop(trajectory_id, None)
            if cohort is not None:
                self._members[cohort].discard(trajectory_id)
                if not self._members[cohort]:
                    del self._members[cohort]
            self._changed.notify_all()

    def _all_arrived(self, cohort: int, turn_index: int) -> bool:
        return all(self._turn[m] >= turn_index for m in self._members.get(cohort, ()))


class ActorTurnBarrier:
    """Implements `rollart.types.TurnBarrier` over a LocalTurnBarrier actor handle (picklable into env workers).

    Every call is bounded: membership changes by `call_timeout_s`, a turn by the barrier's own timeout
    (`barrier_timeout_s`, after which the barrier raises and names the late trajectories) plus that margin.
    """

    def __init__(self, handle, barrier_timeout_s: float, call_timeout_s: float = 30.0) -> None:  # noqa: ANN001
        self.handle = handle
        self.barrier_timeout_s = barrier_timeout_s
        self.call_timeout_s = call_timeout_s

    async def join(self, trajectory_id: str, cohort: int) -> None:
        await asyncio.wait_for(self.handle.join.remote(trajectory_id, cohort), self.call_timeout_s)

    async def before_turn(self, trajectory_id: str, turn_index: int) -> None:
        await asyncio.wait_for(self.handle.before_turn.remote(trajectory_id, turn_index),
                               self.barrier_timeout_s + self.call_timeout_s)

    async def leave(self, trajectory_id: str) -> None:
        await asyncio.wait_for(self.handle.leave.remote(trajectory_id), self.call_timeout_s)
