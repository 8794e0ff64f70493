"""The adaptive batch (`rollout.min_batch_fraction`): a batch of at least the floor, whole groups and the domain mix
kept, taken only while the trainer is idle and only when it makes no running work stale; the ledger, the staleness
bound and the checkpoint stay exact; the metrics say what share was taken."""

from __future__ import annotations

import asyncio

import pytest
from control_fakes import FakeRunner, FakeScorer

from rollart.config import DomainConfig, RedundancyConfig, RolloutConfig, min_batch_groups
from rollart.config.loader import load_config
from rollart.control import RolloutScheduler, SampleBuffer, StalenessPolicy
from rollart.control.buffer import ReadyGroup
from rollart.sim import presets
from rollart.sim.run import simulate
from rollart.types import Status, Task, Trajectory

DOMAINS = {"fast": DomainConfig(env="fast", weight=1.0), "slow": DomainConfig(env="slow", weight=1.0)}


def ready(buffer: SampleBuffer, domain: str, seq: int, version: int = 0) -> None:
    gid = f"{domain}{seq}"
    task = Task(f"{gid}/0", domain, domain, seq, gid)
    members = tuple(Trajectory(f"{gid}/{i}", task, version, status=Status.COMPLETED, reward=1.0) for i in range(2))
    buffer.put(ReadyGroup(gid, seq, domain, members))


def test_the_floor_is_a_share_of_the_groups_rounded_up():
    assert min_batch_groups(RolloutConfig(batch_size=32, group_size=4)) == 8  # 1.0: the full batch
    assert min_batch_groups(RolloutConfig(batch_size=32, group_size=4, min_batch_fraction=0.5)) == 4
    assert min_batch_groups(RolloutConfig(batch_size=32, group_size=4, min_batch_fraction=0.3)) == 3
    assert min_batch_groups(RolloutConfig(batch_size=32, group_size=4, min_batch_fraction=0.01)) == 1


def test_a_floor_below_what_the_trainer_can_split_is_refused_naming_the_field():
    # 16 trajectories in groups of 4, split into 8 mini-batches: a floor of 1 group (4) cannot be split
    with pytest.raises(ValueError, match="rollout.min_batch_fraction"):
        load_config(None, ["rollout.batch_size=16", "rollout.group_size=4", "rollout.min_batch_fraction=0.25",
                           "train.mini_batches=8"])
    load_config(None, ["rollout.batch_size=16", "rollout.group_size=4", "rollout.min_batch_fraction=0.5",
                       "train.mini_batches=8"])


def test_a_partial_batch_keeps_the_stratified_mix_and_whole_groups():
    buffer = SampleBuffer(StalenessPolicy(1), "stratified", {"fast": 1.0, "slow": 1.0})
    for i in range(4):
        ready(buffer, "fast", i)
    for i in range(4, 6):
        ready(buffer, "slow", i)
    # 8 groups wanted; 4 fast + 2 slow ready: the largest batch whose quotas are all ready is 5 (3 fast, 2 slow)
    assert buffer.partial_size(8, 3) == 5
    assert buffer.partial_size(8, 6) == 0
    assert buffer.try_take(8, 0, None) is None  # no floor: the full batch or nothing
    assert buffer.try_take(8, 0, 3, partial_ok=lambda: False) is None  # not allowed now
    batch = buffer.try_take(8, 0, 3, partial_ok=lambda: True)
    assert batch is not None
    assert [g.domain for g in batch].count("fast") == 3 and [g.domain for g in batch].count("slow") == 2
    assert [g.seq for g in batch] == sorted(g.seq for g in batch)  # admission order
    assert all(len(g.trajectories) == 2 for g in batch)
    assert len(buffer.ready_groups) == 1  # the fourth fast group waits for the next batch


def test_first_selection_takes_every_ready_group_over_the_floor():
    buffer = SampleBuffer(StalenessPolicy(1), "first")
    for i in range(3):
        ready(buffer, "fast", i)
    assert buffer.partial_size(8, 3) == 3 and buffer.partial_size(8, 4) == 0
    assert len(buffer.try_take(8, 0, 2) or []) == 3


class Harness:
    """The scheduler with a trainer that is idle or not, as the test says."""

    def __init__(self, rollout: RolloutConfig, latency) -> None:
        self.version = 0
        self.policy = StalenessPolicy(rollout.alpha, rollout.staleness)
        self.runner = FakeRunner(lambda: self.version)
        self.runner.latency = latency
        self.buffer = SampleBuffer(self.policy, rollout.redundancy.selection, {d: 1.0 for d in DOMAINS})
        self.sched = RolloutScheduler(rollout, DOMAINS, self.runner, FakeScorer(), self.buffer, self.policy,
                                      total_batches=4)
        self.free = asyncio.Event()


def cfg(**kw) -> RolloutConfig:
    base = dict(batch_size=16, group_size=4, alpha=1, get_batch_timeout_s=10, min_batch_fraction=0.5,
                redundancy=RedundancyConfig(selection="first"))
    return RolloutConfig(**{**base, **kw})


def test_a_partial_batch_goes_only_once_the_trainer_is_idle_and_resumes_exactly():
    # two groups finish at once, the rest take long: the floor (2 of 4 groups) is reached early
    def latency(task):
        return 0.01 if task.seed < 2 else 0.6

    async def scenario():
        h = Harness(cfg(), latency)
        h.sched.start()
        try:
            taking = asyncio.ensure_future(h.sched.get_batch(0, h.free))
            await asyncio.sleep(0.2)
            assert not taking.done(), "a partial batch was taken while the trainer was busy"
            h.free.set()  # the train step ended: the trainer waits
            batch = await asyncio.wait_for(taking, 1.0)
            metrics = h.sched.metrics()
            state = h.sched.state_dict()
            return h, batch, metrics, state
        finally:
            await h.sched.stop()

    h, batch, metrics, state = asyncio.run(scenario())
    assert 8 <= len(batch) < 16 and len(batch) % 4 == 0
    groups = {}
    for t in batch:
        groups.setdefault(t.group_id, []).append(t)
    assert all(len(g) == 4 for g in groups.values())
    assert metrics["rollout/batch_fraction"] == len(batch) / 16 and metrics["rollout/batches_partial"] == 1
    assert h.sched.check_ledger() == []
    assert h.sched.counts["stale"] == 0  # the version-0 groups still running may join batch 1: nothing discarded
    # the checkpoint after a partial batch: a resumed scheduler replays what ran, nothing of the batch again
    again = Harness(cfg(), latency)
    again.sched.load_state_dict(state)
    trained = {t.group_id for t in batch}
    replayed = {f"g{seq:06d}" for _, seq, _ in again.sched.admission.replay}
    assert replayed and not replayed & trained
    assert again.sched.admission.next_seq == state["next_seq"]


def test_no_partial_batch_while_running_work_would_be_made_stale():
    # α = 0: every group running serves only this batch; a partial batch would discard it, so the full one waits
    def latency(task):
        return 0.3 if task.seed % 2 else 0.01

    async def scenario():
        h = Harness(cfg(alpha=0), latency)
        h.free.set()
        h.sched.start()
        try:
            batch = await asyncio.wait_for(h.sched.get_batch(0, h.free), 5.0)
            return h, batch
        finally:
            await h.sched.stop()

    h, batch = asyncio.run(scenario())
    assert len(batch) == 16 and h.sched.metrics()["rollout/batch_fraction"] == 1.0
    assert h.sched.check_ledger() == []


def test_the_twin_with_pacing_and_the_adaptive_batch_keeps_its_invariants():
    cfg_, hw = presets.scaled_cluster(0.05, alpha=1, steps=6)
    cfg_ = cfg_.model_copy(update={"rollout": cfg_.rollout.model_copy(
        update={"pacing": "measured", "min_batch_fraction": 0.5})})
    report = simulate(cfg_, hw)
    assert report.ledger_violations == [] and report.staleness_violations == []
    fractions = [s["rollout/batch_fraction"] for s in report.steps]
    assert all(0.5 <= f <= 1.0 for f in fractions) and min(fractions) < 1.0
    assert all(s["trajectories"] == round(f * cfg_.rollout.batch_size) for s, f in zip(report.steps, fractions))
