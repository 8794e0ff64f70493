"""The env router's side of a forecast group (`expect`): its members are assigned to the least-loaded
workers, each told how many envs to stage, and the group's trajectories then go to those workers (others
to the least loaded). Worker handles are fakes with Ray's `.method.remote(...)` shape: the routing is the
point here; the workers and their pools run for real in tests/integration/test_envs_worker.py."""

from __future__ import annotations

import asyncio

from rollart.base.batched_calls import Outbox
from rollart.envs.router import EnvRouter
from rollart.types import Status, Task, Trajectory, UpcomingGroup


class _Method:
    def __init__(self, fn) -> None:
        self.remote = fn


class FakeWorker:
    def __init__(self) -> None:
        self.expected: list[UpcomingGroup] = []
        self.ran: list[str] = []
        self.outbox = Outbox()
        self.submit, self.take, self.expect = _Method(self._submit), _Method(self._take), _Method(self._expect)

    async def _submit(self, channel, items):  # the batched `run` (EnvWorker.submit/take)
        self.outbox.start(channel, [(seq, self._run(*args)) for seq, args in items])

    async def _take(self, channel):
        return await self.outbox.take(channel, 5.0)

    async def _run(self, task, start_version, sampling):
        self.ran.append(task.trajectory_id)
        await asyncio.sleep(0.01)
        return Trajectory(task.trajectory_id, task, start_version).finished(Status.COMPLETED)

    async def _expect(self, group):
        self.expected.append(group)


def task(group: str, member: int, seed: int) -> Task:
    return Task(f"{group}/{member}", "swe", "swe", seed, group)


def test_a_forecast_group_is_split_over_the_least_loaded_workers_and_its_members_follow():
    workers = [FakeWorker() for _ in range(3)]
    router = EnvRouter(workers)

    async def scenario():
        await router.expect(UpcomingGroup(task("g1", 0, 11), 4))
        assert [[(g.task.seed, g.size) for g in w.expected] for w in workers] == [[(11, 2)], [(11, 1)], [(11, 1)]]
        await asyncio.gather(*(router.run(task("g1", m, 11), 0) for m in range(4)))
        assert [len(w.ran) for w in workers] == [2, 1, 1]  # where each was told to stage its env
        await router.run(task("g1", 4, 11), 0)  # a replacement past the forecast: the least loaded
        await router.run(task("g2", 0, 12), 0)  # a group nobody forecast: the least loaded
        assert sum(len(w.ran) for w in workers) == 6 and not router._reserved

    asyncio.run(scenario())


def test_a_forecast_of_a_domain_without_a_warm_pool_reserves_workers_but_sends_them_nothing():
    workers = [FakeWorker() for _ in range(2)]
    router = EnvRouter(workers)
    router.staging = frozenset({"frozenlake"})  # (as `place` sets it: the pooled domains)

    async def scenario():
        await router.expect(UpcomingGroup(task("g1", 0, 11), 2))
        assert [w.expected for w in workers] == [[], []]  # no actor call: the workers would stage nothing
        await asyncio.gather(*(router.run(task("g1", m, 11), 0) for m in range(2)))
        assert [len(w.ran) for w in workers] == [1, 1] and not router._reserved  # the reservation still routes

    asyncio.run(scenario())


def test_a_worker_dying_under_batched_runs_ends_each_of_them_with_worker_died():
    import ray.exceptions

    from rollart.resources.errors import WorkerDied

    class DyingWorker(FakeWorker):
        async def _run(self, task, start_version, sampling):
            self.ran.append(task.trajectory_id)
            await asyncio.sleep(10)

        async def _take(self, channel):
            await asyncio.sleep(0.01)
            raise ray.exceptions.ActorDiedError()  # as Ray raises for a call the actor's death ended

    router = EnvRouter([DyingWorker()])

    async def scenario():
        runs = [router.run(task("g1", m, 11), 0) for m in range(3)]
        return await asyncio.gather(*runs, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert len(outcomes) == 3 and all(isinstance(o, WorkerDied) for o in outcomes)
    assert not router._where and sum(router._load.values()) == 0
