"""The per-domain circuit breaker: a domain whose own code keeps failing stops rollout at once with
`DomainBroken` (the domain, the count, the first error and its traceback); failures of the infrastructure,
aborts and timeouts never count; a flaky domain (most trajectories fine) never trips it."""

from __future__ import annotations

import asyncio
import random

import pytest
from test_control_scheduler import DOMAINS, Harness, rollout_cfg

from rollart.config import CircuitBreakerConfig
from rollart.control import DomainBroken
from rollart.control.breaker import DomainBreaker
from rollart.types import Fault, Status, Task, Trajectory


def ended(domain: str, status: Status, fault: Fault | None = None, i: int = 0) -> Trajectory:
    task = Task(f"t{i}", domain, domain, seed=0, group_id="g")
    traj = Trajectory(f"t{i}", task, 0).finished(status, "why", fault=fault)
    return traj.scored(1.0) if status.trainable else traj


def raised(where: str = "agent") -> Fault:
    try:
        raise TypeError("create() got an unexpected keyword argument 'n'")
    except TypeError as exc:
        return Fault.of(where, exc)


def test_consecutive_faults_trip_it_and_a_success_resets_the_count() -> None:
    breaker = DomainBreaker(CircuitBreakerConfig(consecutive_failures=3, failure_rate=1.0, window=100))
    bad = [ended("a", Status.FAILED, raised(), i) for i in range(3)]
    assert breaker.record(bad[0]) is None and breaker.record(bad[1]) is None
    assert breaker.record(ended("a", Status.COMPLETED)) is None  # a success: the run starts again
    assert breaker.record(bad[0]) is None and breaker.record(bad[1]) is None
    trip = breaker.record(bad[2])
    assert trip is not None and (trip.domain, trip.failed, trip.counted, trip.consecutive) == ("a", 5, 6, 3)
    assert trip.first.error == "TypeError: create() got an unexpected keyword argument 'n'"
    assert trip.first.traceback.startswith("Traceback (most recent call last)")
    assert breaker.record(bad[0]) is None  # it trips once


def test_what_is_not_the_domains_fault_never_counts() -> None:
    breaker = DomainBreaker(CircuitBreakerConfig(consecutive_failures=2, failure_rate=0.5, window=2))
    for i in range(50):  # a dead worker, a service out, a timeout (no fault), aborted, stale: neither way
        for status in (Status.FAILED, Status.ABORTED, Status.STALE):
            assert breaker.record(ended("a", status, None, i)) is None
    assert breaker.record(ended("a", Status.FAILED, raised())) is None
    assert breaker.record(ended("b", Status.FAILED, raised())) is None  # per domain
    assert breaker.record(ended("a", Status.FAILED, raised())) is not None


def test_a_flaky_domain_does_not_trip_it_but_a_mostly_broken_one_does() -> None:
    cfg = CircuitBreakerConfig()  # the defaults: 32 in a row, or 95% of the last 100
    rng = random.Random(0)
    flaky = DomainBreaker(cfg)  # 60% of its trajectories fail (the e2e test's injected faults are about that)
    assert all(flaky.record(ended("a", Status.FAILED, raised()) if rng.random() < 0.6 else
                            ended("a", Status.COMPLETED)) is None for _ in range(5000))
    broken = DomainBreaker(cfg)  # 97% fail, never 32 in a row: the rate trips it
    trips = [broken.record(ended("a", Status.FAILED, raised()) if i % 30 else ended("a", Status.COMPLETED))
             for i in range(1, 200)]
    assert any(trips)
    off = DomainBreaker(CircuitBreakerConfig(consecutive_failures=0))
    assert off.record(ended("a", Status.FAILED, raised())) is None


def test_a_domain_that_always_fails_stops_rollout_at_once_with_its_first_error() -> None:
    fault = raised("env.step")

    async def main():
        h = Harness(rollout_cfg(get_batch_timeout_s=600), steps=3, fail=lambda task: task.domain == "slow")
        inner = h.runner.run

        async def run(task, version):  # the failing domain's env raises: its trajectories carry the fault
            traj = await inner(task, version)
            return traj.finished(traj.status, traj.status_reason, fault=fault) if traj.status is Status.FAILED \
                else traj

        h.runner.run = run
        h.sched.start()
        start = asyncio.get_running_loop().time()
        try:
            with pytest.raises(DomainBroken) as info:
                for k in range(3):
                    await h.sched.get_batch(k)
                    h.serve(k + 1)
        finally:
            await h.sched.stop()
        assert asyncio.get_running_loop().time() - start < 5.0  # not the 600 s of get_batch_timeout_s
        message = str(info.value)
        assert message.startswith("domain 'slow' is broken: all ") and "failed in its own code (32 in a row)" in message
        assert "The first failure, in env.step: injected env failure" in message
        assert message.count("Traceback (most recent call last)") == 1
        assert "Fix the environment of domains.slow" in message
        assert h.sched.check_ledger() == []  # every trajectory started still ended exactly once

    asyncio.run(main())


def test_a_reward_function_that_always_raises_stops_rollout_at_once_naming_it() -> None:
    """A reward function's own exception is the domain's fault (`RewardResult.fault`), not an outage."""
    from rollart.types import RewardResult

    fault = raised("reward")

    async def main():
        h = Harness(rollout_cfg(get_batch_timeout_s=600), steps=3)
        inner = h.scorer.score

        async def score(traj):
            if traj.domain != "slow":
                return await inner(traj)
            return RewardResult(traj.trajectory_id, 0.0, ok=False, error="reward fn 'm:f' raised TypeError",
                                attempts=4, fault=fault)

        h.scorer.score = score
        h.sched.start()
        start = asyncio.get_running_loop().time()
        try:
            with pytest.raises(DomainBroken) as info:
                for k in range(3):
                    await h.sched.get_batch(k)
                    h.serve(k + 1)
        finally:
            await h.sched.stop()
        assert asyncio.get_running_loop().time() - start < 5.0
        message = str(info.value)
        assert "The first failure, in reward: reward failed after 4 tries: reward fn 'm:f' raised TypeError" in message
        assert message.count("Traceback (most recent call last)") == 1
        assert "Fix the reward function domains.slow.reward.fn" in message and "compute_score" in message
        assert h.sched.check_ledger() == []

    asyncio.run(main())
