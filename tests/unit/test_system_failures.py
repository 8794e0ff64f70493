"""The system under failures (fake env router and reward, the real `System`): an evaluation episode that
failed runs again with the same seed, up to `eval.retries`, and one that keeps failing is counted as failed
and left out of the mean — never averaged in as 0; what cannot be recovered stops rollout at once."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from types import SimpleNamespace

import pytest

from rollart.config.loader import load_config
from rollart.control import SchedulerFailed
from rollart.resources.worker_set import MemberEvent
from rollart.resources.errors import WorkerDied
from rollart.job.system import System
from rollart.types import RewardResult, Status, Trajectory, Turn


class FlakyRouter:
    """frozenlake: the first try of every even seed dies with its worker; math: seed 0 always fails."""

    def __init__(self) -> None:
        self.tries: Counter = Counter()
        self.seeds: dict[str, int] = {}

    async def run(self, task, start_version):
        self.tries[(task.domain, task.seed)] += 1
        self.seeds[task.trajectory_id] = task.seed
        if task.domain == "frozenlake" and task.seed % 2 == 0 and self.tries[(task.domain, task.seed)] == 1:
            raise WorkerDied("env/env/0", "SIGKILL")
        traj = Trajectory(task.trajectory_id, task, 0, (Turn((1,), (2,), (-0.1,), (0,)),))
        if task.domain == "math" and task.seed == 0:
            return traj.finished(Status.FAILED, "env.step failed: boom")
        return traj.finished(Status.COMPLETED)

    async def expect(self, group):
        pass


class Reward:
    def for_run(self, run_id):  # an evaluation scores as a run of its own
        return self

    async def score(self, traj):
        return RewardResult(traj.trajectory_id, 1.0 if traj.task.seed % 2 else 0.0)


def test_infrastructure_failures_are_retried_and_counted_never_scored_as_zero():
    cfg = load_config(None, ["eval.episodes_per_domain=4", "eval.retries=2"])
    router = FlakyRouter()
    system = System(cfg, None, None, None, None, {}, None, router, Reward(), None)
    result = asyncio.run(system.evaluate("t"))
    assert result.scored == {"frozenlake": 4, "math": 3} and result.failed == {"frozenlake": 0, "math": 1}
    assert result.scores == {"frozenlake": 0.5, "math": 2 / 3}  # math's failure is not a 0 in its mean
    assert result.mean == (0.5 + 2 / 3) / 2
    assert router.tries[("math", 0)] == 3 and router.tries[("frozenlake", 0)] == 2
    assert len(set(router.seeds)) == len(router.seeds) and "eval/t/math/0~2" in router.seeds  # fresh ids, same seed


def test_what_cannot_be_recovered_stops_rollout_within_a_second_naming_it():
    class NoWorkersLeft(FlakyRouter):
        cluster = None

        def members(self):
            return []

        async def cancel(self, trajectory_id, status, reason):
            pass

    cfg = load_config(None, ["rollout.get_batch_timeout_s=600"])
    system = System(cfg, None, None, None, SimpleNamespace(version=0), {}, None, NoWorkersLeft(), Reward(), None)

    async def main():
        scheduler = system.start_rollout(batches=3)
        lost = MemberEvent("unplaced", "env", 0, "env/env/0", "env", cause="no pool it may use has room")
        threading.Thread(target=system._env_changed, args=(lost,)).start()  # as the health check would
        start = asyncio.get_running_loop().time()
        try:
            with pytest.raises(SchedulerFailed, match=r"the env workers \(env/env/0 died\) failed: .*no env worker"):
                await scheduler.get_batch(0)
        finally:
            await scheduler.stop()
        return asyncio.get_running_loop().time() - start

    assert asyncio.run(main()) < 1.0  # not the 600 s of rollout.get_batch_timeout_s
    assert [m.name for m in system.incidents] == ["worker not replaced"]
