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


class _Gate:
    """One cohort's wait at one turn: how many of its members are still short of that turn, and the event its
    waiters wait on (an Event, not a shared future: a waiter that times out cancels only its own wait)."""

    __slots__ = ("behind", "opened")

    def __init__(self, behind: int) -> None:
        self.behind = behind
        self.opened = asyncio.Event()


class LocalTurnBarrier:
    def __init__(self, timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self._cohort: dict[str, int] = {}
        self._turn: dict[str, int] = {}  # the turn each member has arrived at (-1: not yet)
        self._members: dict[int, set[str]] = defaultdict(set)
        # cohort → turn → its gate while some member waits there. Each arrival or departure updates the few open
        # gates of its cohort, and a cohort's members are counted once per turn, when its first waiter opens the
        # gate — linear in the cohort per turn, where re-checking every member at every arrival was cubic (a
        # paper-scale batch of 5,120 under the barrier did not finish).
        self._gates: dict[int, dict[int, _Gate]] = defaultdict(dict)

    async def join(self, trajectory_id: str, cohort: int) -> None:
        self._cohort[trajectory_id] = cohort
        self._turn[trajectory_id] = -1
        self._members[cohort].add(trajectory_id)
        for gate in self._gates.get(cohort, {}).values():
            gate.behind += 1  # every open gate is at a turn ≥ 0, which a member that just joined has not reached

    async def before_turn(self, trajectory_id: str, turn_index: int) -> None:
        if trajectory_id not in self._cohort:
            return  # not under a barrier (e.g. an evaluation episode)
        cohort = self._cohort[trajectory_id]
        self._move(cohort, self._turn[trajectory_id], turn_index)
        self._turn[trajectory_id] = turn_index
        gate = self._gates[cohort].get(turn_index)
        if gate is None:
            behind = sum(1 for m in self._members[cohort] if self._turn[m] < turn_index)
            if not behind:
                return
            gate = self._gates[cohort][turn_index] = _Gate(behind)
        try:
            async with asyncio.timeout(self.timeout_s):
                await gate.opened.wait()
        except TimeoutError:
            late = sorted(m for m in self._members[cohort] if self._turn[m] < turn_index)
            raise TimeoutError(
                f"turn barrier: {trajectory_id} waited {self.timeout_s:.0f}s at turn {turn_index} for "
                f"{len(late)} trajectories of cohort {cohort} ({late[:5]}…)"
            ) from None

    async def leave(self, trajectory_id: str) -> None:
        cohort = self._cohort.pop(trajectory_id, None)
        turn = self._turn.pop(trajectory_id, None)
        if cohort is None:
            return
        self._members[cohort].discard(trajectory_id)
        self._move(cohort, turn, None)
        if not self._members[cohort]:
            del self._members[cohort]
            self._gates.pop(cohort, None)

    def _move(self, cohort: int, old: int | None, new: int | None) -> None:
        """A member of `cohort` went from turn `old` to `new` (None: it left): every gate it stops (or starts)
        being short of counts it, and a gate with no member short of its turn opens."""
        gates = self._gates.get(cohort)
        if not gates:
            return
        for turn, gate in list(gates.items()):
            was_behind = old is not None and old < turn
            is_behind = new is not None and new < turn
            gate.behind += int(is_behind) - int(was_behind)
            if gate.behind <= 0:
                gate.opened.set()
                del gates[turn]


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
