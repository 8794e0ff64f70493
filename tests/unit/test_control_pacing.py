"""Admission pacing (`rollout.pacing=measured`, rollart/control/pacing.py): the rule on its measurements, the
admission it holds back, and that it can never hold back the group a batch needs to form."""

from __future__ import annotations

import asyncio

import pytest
from control_fakes import FakeRunner, FakeScorer

from rollart.config import DomainConfig, RedundancyConfig, RolloutConfig
from rollart.control import RolloutScheduler, SampleBuffer, StalenessPolicy
from rollart.control.pacing import Pacer

DOMAINS = {"fast": DomainConfig(env="fast", weight=1.0), "slow": DomainConfig(env="slow", weight=1.0)}


def test_nothing_measured_admits_and_a_group_too_slow_for_the_time_left_is_held():
    pacer = Pacer()
    assert pacer.admits("slow", 1, now=0.0)  # no measurement: no guess
    pacer.batch_taken(0.0)
    pacer.batch_taken(60.0)  # one batch a minute
    pacer.admitted("g0", 60.0)
    pacer.completed("g0", "slow", 130.0)  # a slow group takes 70 s
    pacer.admitted("g1", 60.0)
    pacer.completed("g1", "fast", 65.0)
    assert pacer.interval_s == pytest.approx(60.0) and pacer.latency_s == {"slow": 70.0, "fast": 5.0}
    # just after a batch was taken, with one batch left in the window: 60 s left, the slow domain needs 70
    assert pacer.time_left(1, 60.0) == pytest.approx(60.0)
    assert not pacer.admits("slow", 1, now=60.0)
    assert pacer.admits("fast", 1, now=60.0)
    # with the whole window ahead (two batches: 120 s) it fits
    assert pacer.admits("slow", 2, now=60.0)
    assert pacer.metrics()["rollout/pacing_held_back"] == 1.0


def test_latency_is_a_high_quantile_of_the_recent_groups_and_unfinished_groups_are_forgotten():
    pacer = Pacer()
    for i in range(10):
        pacer.admitted(f"g{i}", 0.0)
        pacer.completed(f"g{i}", "math", float(i + 1))  # 1 … 10 s
    assert pacer.latency_s["math"] == 10.0  # the 90th percentile of ten: the tail, not the mean (5.5)
    pacer.admitted("gone", 0.0)
    pacer.prune({"g-still-held"})
    assert "gone" not in pacer.started


class Loop:
    """A miniature driver with a train step of `train_s`: get_batch(k) → train → weights k + 1 served."""

    def __init__(self, rollout: RolloutConfig, steps: int, latency, train_s: float = 0.05) -> None:
        self.version, self.rollout, self.steps, self.train_s = 0, rollout, steps, train_s
        self.policy = StalenessPolicy(rollout.alpha, rollout.staleness)
        self.runner = FakeRunner(lambda: self.version)
        self.runner.latency = latency
        self.buffer = SampleBuffer(self.policy, rollout.redundancy.selection, {d: 1.0 for d in DOMAINS})
        self.sched = RolloutScheduler(rollout, DOMAINS, self.runner, FakeScorer(), self.buffer, self.policy,
                                      total_batches=steps, clock=lambda: asyncio.get_running_loop().time())

    def serve(self, version: int) -> None:
        self.version = version
        self.sched.set_inference_version(version)

    async def run(self) -> list[tuple[int, list]]:
        batches = []
        self.sched.start()
        training = None
        try:
            for k in range(self.steps):
                batch = await self.sched.get_batch(k)
                batches.append((k, batch))
                if training is not None:
                    await training
                training = asyncio.create_task(self._train(k + 1))
            await training
        finally:
            await self.sched.stop()
        return batches

    async def _train(self, version: int) -> None:
        await asyncio.sleep(self.train_s)
        self.serve(version)


def slow_tail(task) -> float:
    # the "slow" domain has a long tail: one group in four takes four times as long
    if task.domain == "slow":
        return 0.16 if task.seed % 4 == 0 else 0.04
    return 0.01


@pytest.mark.parametrize("pacing", ["off", "measured"])
def test_paced_admission_keeps_every_invariant_and_holds_back_only_under_newer_weights(pacing):
    cfg = RolloutConfig(batch_size=16, group_size=4, alpha=1, get_batch_timeout_s=20, pacing=pacing,
                        redundancy=RedundancyConfig(selection="stratified"))
    loop = Loop(cfg, steps=8, latency=slow_tail)
    batches = asyncio.run(loop.run())
    assert loop.sched.check_ledger() == []
    assert all(len(b) == 16 for _, b in batches)
    assert all(loop.policy.is_fresh(t, k) for k, b in batches for t in b)
    metrics = loop.sched.metrics()
    if pacing == "measured":
        assert metrics["rollout/pacing_held_back"] > 0
        assert metrics["rollout/pacing_latency_s/slow"] > metrics["rollout/pacing_latency_s/fast"]
    else:
        assert "rollout/pacing_held_back" not in metrics


def test_pacing_never_holds_the_group_the_last_batch_needs():
    # The last batch: the window is clamped to one batch and no newer weights will come before it — a pacer
    # that held a slow group here would deadlock the run (the batch needs it; the next weights need the batch).
    cfg = RolloutConfig(batch_size=8, group_size=4, alpha=1, get_batch_timeout_s=5, pacing="measured",
                        redundancy=RedundancyConfig(selection="first"))
    loop = Loop(cfg, steps=4, latency=lambda task: 0.3 if task.seed % 2 else 0.01)
    batches = asyncio.run(loop.run())
    assert [k for k, _ in batches] == [0, 1, 2, 3] and loop.sched.check_ledger() == []
