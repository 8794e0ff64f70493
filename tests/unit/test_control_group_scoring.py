"""A domain whose reward function takes a batch (TRL's shape) is scored one call per finished group: the group's
first `group_size` finishers together (redundant stragglers never), a group that runs out of running members with
fewer is scored with what it has, a failed member's replacement later; every trajectory still ends exactly once.
Other domains are scored one trajectory at a time, as before."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from control_fakes import FakeScorer
from test_control_scheduler import Harness, check_invariants, rollout_cfg

from rollart.config import RedundancyConfig
from rollart.types import GroupRewardScorer, RewardResult, Trajectory


@dataclass
class BatchingScorer(FakeScorer):
    batched_domains: tuple[str, ...] = ("fast",)
    calls: list[list[str]] = field(default_factory=list)

    def scores_groups(self, domain: str) -> bool:
        return domain in self.batched_domains

    async def score_group(self, trajectories: list[Trajectory]) -> list[RewardResult]:
        assert len({t.group_id for t in trajectories}) == 1
        self.calls.append([t.trajectory_id for t in trajectories])
        return [await self.score(t) for t in trajectories]


def harness(extra: int = 0, fail=None, steps: int = 4) -> Harness:
    h = Harness(rollout_cfg(redundancy=RedundancyConfig(extra_per_group=extra, selection="first")), steps=steps,
                latency=lambda task: 0.002 + 0.004 * (int(task.trajectory_id.rsplit("/", 1)[1]) % 3), fail=fail)
    h.scorer = BatchingScorer()
    h.sched.scorer = h.scorer
    h.sched.scoring.scorer = h.scorer
    assert isinstance(h.scorer, GroupRewardScorer)
    return h


def test_a_batched_domain_is_scored_once_per_finished_group() -> None:
    h = harness(extra=1)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    trained = [t for _, b in batches for t in b]
    fast_groups = {t.group_id for t in trained if t.domain == "fast"}
    assert fast_groups
    for group in fast_groups:  # each trained group of the batched domain: one call, with exactly its members
        calls = [c for c in h.scorer.calls if c[0].rsplit("/", 1)[0] == group]
        members = sorted(t.trajectory_id for t in trained if t.group_id == group)
        assert [sorted(c) for c in calls] == [members], (group, calls)
    assert all(len(c) <= 4 for c in h.scorer.calls)
    slow = {t.trajectory_id for t in trained if t.domain == "slow"}
    assert slow and slow <= set(h.scorer.scored)  # scored one at a time, never in a group's call
    assert not slow & {tid for c in h.scorer.calls for tid in c}
    assert h.sched.check_ledger() == []


def test_a_group_with_a_failed_member_is_scored_with_what_can_still_come() -> None:
    failing = {"0"}
    h = harness(fail=lambda task: task.domain == "fast" and task.trajectory_id.rsplit("/", 1)[1] in failing)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    # member 0 of each fast group fails: members 1-3 are scored together, and the replacement (4) with them if it
    # finished in time, else on its own once nothing else of the group can come
    trained = [t for _, b in batches for t in b]
    calls = h.scorer.calls
    assert calls and all(len(c) <= 4 for c in calls) and not any(tid.endswith("/0") for c in calls for tid in c)
    scored = [tid for c in calls for tid in c]
    assert len(scored) == len(set(scored))  # no trajectory scored twice
    for group in {t.group_id for t in trained if t.domain == "fast"}:
        mine = [c for c in calls if c[0].rsplit("/", 1)[0] == group]
        members = sorted(t.trajectory_id for t in trained if t.group_id == group)
        assert len(mine) <= 2 and sorted(tid for c in mine for tid in c) == members
    assert h.sched.check_ledger() == []
