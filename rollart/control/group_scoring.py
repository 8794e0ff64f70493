"""Scoring a group's finished members: each alone the moment it ends, or — for a domain whose reward function takes
a batch (TRL's shape) — the group's members together, in one call.

In: the scheduler's `RewardScorer` (a `GroupRewardScorer` may score whole groups: `scores_groups(domain)`), a
way to run a task in the background (the scheduler's, so its failure stops rollout), and from the scheduler,
per finished trainable member: its group id and a function giving how many more scored members the group needs
and how many of its other members are still running (called only for a batched domain's group: counting them
is per-member work the twin's 10,000 trajectories a step would otherwise pay for every member). Out: the
member's `RewardResult`, or None when its group closed before it was scored (the scheduler then ends it as the
group's close says).

Batched domains: a finished member waits in its group's pending list; the list is scored with one
`score_group` call as soon as it holds the members the group still needs, or no other member of the group is
still running (a member that failed, a group of fewer finishers) — `poke` re-checks that whenever a member of
the group ends. Members finishing while a call that may complete the group is in flight wait for its answer
(the group then closes and they are never scored: redundant), else start a new list. Every other domain: `score`, at
once, as before. Nothing waits without bound: each pending member's group either fills, runs out of running
members, or closes (`drop`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine

from rollart.types import GroupRewardScorer, RewardResult, RewardScorer, Trajectory

GroupState = Callable[[], tuple[int, int]]  # (scored members the group still needs, its other members running)


class GroupScoring:
    def __init__(self, scorer: RewardScorer, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.scorer = scorer
        self.spawn = spawn
        self._pending: dict[str, list[tuple[Trajectory, asyncio.Future[RewardResult | None]]]] = {}
        # per group: members in a call whose result the scheduler has not taken yet (it counts them as scored then)
        self._in_flight: dict[str, set[str]] = {}

    @property
    def scorer(self) -> RewardScorer:
        return self._scorer

    @scorer.setter
    def scorer(self, scorer: RewardScorer) -> None:
        self._scorer = scorer
        # (checked once: an isinstance against a runtime-checkable protocol cost ~40 µs a call in the twin)
        self._groups = scorer if isinstance(scorer, GroupRewardScorer) else None

    def batched(self, domain: str) -> bool:
        return self._groups is not None and self._groups.scores_groups(domain)

    def waiting(self, group_id: str) -> set[str]:
        """Ids of the group's members waiting for their group's call, or for the scheduler to take its result."""
        return {t.trajectory_id for t, _ in self._pending.get(group_id, ())} | self._in_flight.get(group_id, set())

    async def score(self, traj: Trajectory, state: GroupState) -> RewardResult | None:
        """`traj`'s result: scored alone, or with its group (see the module docstring)."""
        if not self.batched(traj.domain):
            return await self.scorer.score(traj)
        future: asyncio.Future[RewardResult | None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(traj.group_id, []).append((traj, future))
        self.poke(traj.group_id, state)
        try:
            return await future
        finally:  # the scheduler takes the result next, with no await between: it counts as scored from here
            flying = self._in_flight.get(traj.group_id)
            if flying is not None:
                flying.discard(traj.trajectory_id)
                if not flying:
                    del self._in_flight[traj.group_id]

    def poke(self, group_id: str, state: GroupState) -> None:
        """Score the group's pending members now if they are all it needs, or all that can still come — unless a
        call in flight may complete the group (its answer pokes again: the group closes, or still needs them)."""
        pending = self._pending.get(group_id)
        if not pending:
            return
        needed, others_running = state()
        still = needed - len(self._in_flight.get(group_id, ()))
        if still <= 0:
            return
        if len(pending) >= still or others_running == 0:
            del self._pending[group_id]
            self._in_flight.setdefault(group_id, set()).update(t.trajectory_id for t, _ in pending)
            self.spawn(self._call(pending))

    def drop(self, group_id: str) -> None:
        """The group closed: its pending members are not scored (their results: None)."""
        for _, future in self._pending.pop(group_id, ()):
            if not future.done():
                future.set_result(None)

    async def _call(self, pending: list[tuple[Trajectory, asyncio.Future[RewardResult | None]]]) -> None:
        trajectories = [t for t, _ in pending]
        assert self._groups is not None
        try:
            results = await self._groups.score_group(trajectories)
            if len(results) != len(trajectories):
                raise RuntimeError(f"score_group returned {len(results)} results for {len(trajectories)} trajectories")
        except Exception as exc:  # noqa: BLE001 — a scorer never raises by contract; if it does, each member fails
            results = [RewardResult(t.trajectory_id, 0.0, ok=False, error=f"scoring the group raised {exc!r}")
                       for t in trajectories]
        for (_, future), result in zip(pending, results):
            if not future.done():
                future.set_result(result)
