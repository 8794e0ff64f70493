"""RolloutScheduler + SampleBuffer: admission bound, staleness in every batch, redundancy cancellation,
failure replacement and the exactly-once ledger, driven by a miniature of the driver's loop."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from control_fakes import FakeRunner, FakeScorer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.config import DomainConfig, RedundancyConfig, RolloutConfig
from rollart.control import (BatchTimeout, Fate, RolloutScheduler, SampleBuffer, SchedulerFailed, StalenessPolicy,
                             LocalTurnBarrier)
from rollart.control.buffer import ReadyGroup
from rollart.control.ledger import trajectory_digest
from rollart.types import Status, Task, Trajectory

DOMAINS = {"fast": DomainConfig(env="fast", weight=1.0), "slow": DomainConfig(env="slow", weight=1.0)}


class Harness:
    """A miniature driver: get_batch(k) → weights k served → (training is instant here)."""

    def __init__(self, rollout: RolloutConfig, steps: int, *, seed=0, latency=None, fail=None,
                 score_fail=0.0, turn_barrier=None, domains=DOMAINS, ledger_sink=None, scorer=None, group_filter=None,
                 max_filtered=0):
        self.version = 0
        self.rollout = rollout
        self.policy = StalenessPolicy(rollout.alpha, rollout.staleness)
        self.runner = FakeRunner(lambda: self.version, turn_barrier=turn_barrier)
        if latency:
            self.runner.latency = latency
        if fail:
            self.runner.fail = fail
        self.scorer = scorer or FakeScorer(fail_prob=score_fail, seed=seed)
        self.buffer = SampleBuffer(self.policy, rollout.redundancy.selection,
                                   {d: c.weight for d, c in domains.items()})
        self.sched = RolloutScheduler(rollout, domains, self.runner, self.scorer, self.buffer, self.policy,
                                      total_batches=steps, seed=seed, turn_barrier=turn_barrier, ledger_sink=ledger_sink,
                                      group_filter=group_filter, max_filtered_groups=max_filtered)
        self.steps = steps
        self.max_pending = self.max_running = 0
        g = rollout.group_size + rollout.redundancy.extra_per_group
        self.bound = (rollout.alpha + 1) * self.sched.groups_per_batch * g

    def serve(self, version: int) -> None:
        self.version = version
        self.sched.set_inference_version(version)

    async def _monitor(self):
        while True:
            running = sum(1 for f in self.sched.fate.values() if f is Fate.RUNNING)
            # unsettled runs counted from the groups themselves (a scored member waiting for its group is still
            # RUNNING in the ledger but settled)
            unsettled = sum(len(g.running()) for g in self.sched.groups.by_id.values())
            self.max_running = max(self.max_running, unsettled)
            self.max_pending = max(self.max_pending, running + self.buffer.ready_trajectories())
            await asyncio.sleep(0.001)

    async def run(self):
        batches = []
        self.sched.start()
        mon = asyncio.create_task(self._monitor())
        try:
            for k in range(self.steps):
                if self.version < k - self.rollout.alpha:
                    self.serve(k)  # α = 0: the previous train step must land before batch k can start
                batch = await self.sched.get_batch(k)
                batches.append((k, batch))
                self.serve(k)  # the weights of train step k-1 are swapped in (suspend/update/resume)
        finally:
            mon.cancel()
            await self.sched.stop()
        return batches


def rollout_cfg(**kw) -> RolloutConfig:
    base = dict(batch_size=8, group_size=4, alpha=1, get_batch_timeout_s=20,
                redundancy=RedundancyConfig(selection="first"))
    base.update(kw)
    return RolloutConfig(**base)


def check_invariants(h: Harness, batches):
    policy = h.policy
    trained = [t.trajectory_id for _, b in batches for t in b]
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    for k, batch in batches:
        assert len(batch) == h.rollout.batch_size
        for t in batch:
            assert policy.is_fresh(t, k), f"{t.trajectory_id} stale for batch {k}"
            assert t.reward is not None and t.status.trainable
        groups = {}
        for t in batch:
            groups.setdefault(t.group_id, []).append(t)
        assert all(len(g) == h.rollout.group_size for g in groups.values()), "batch holds a partial group"
    assert h.sched.check_ledger() == []
    # every trajectory started has exactly one fate, and none is left running after stop(); one whose group
    # closed before its task first ran never reached the runner, and was not trained
    assert set(h.runner.runs) <= set(h.sched.fate)
    assert all(h.sched.fate[t] in (Fate.ABORTED, Fate.STALE) for t in set(h.sched.fate) - set(h.runner.runs))
    assert Fate.RUNNING not in set(h.sched.fate.values())
    assert sum(1 for f in h.sched.fate.values() if f is Fate.TRAINED) == len(trained)
    assert h.max_pending <= h.bound, f"pending {h.max_pending} exceeded (α+1)·(B+R) = {h.bound}"
    # the peak counter: at least what the monitor saw running at once, within the bound, nothing left after stop
    assert h.max_running <= h.sched.metrics()["rollout/running_peak"] <= h.bound
    assert h.sched.groups.unsettled == 0


def test_async_alpha1_batches_are_fresh_and_ledger_is_exact():
    h = Harness(rollout_cfg(alpha=1), steps=5, latency=lambda t: 0.002 + (t.seed % 5) * 0.004)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)


def test_alpha0_never_admits_while_the_batch_trains():
    h = Harness(rollout_cfg(alpha=0), steps=4)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    # with α = 0 every trained trajectory was generated entirely by the version it is trained at
    for k, batch in batches:
        assert all(set(turn.versions) == {k} for t in batch for turn in t.turns)


def test_redundant_stragglers_are_cancelled_and_counted():
    slow = lambda t: 0.3 if t.trajectory_id.endswith("/4") else 0.004  # noqa: E731 - the 5th member of each group
    h = Harness(rollout_cfg(redundancy=RedundancyConfig(extra_per_group=1, selection="first")), steps=3, latency=slow)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    # every trained group's slow 5th member was cancelled while it ran, not left to finish
    trained_groups = {t.group_id for _, b in batches for t in b}
    cancelled = {tid.split("/")[0] for tid, status, why in h.runner.cancelled
                 if status is Status.ABORTED and why.startswith("redundant")}
    assert trained_groups <= cancelled
    assert h.sched.counts["aborted"] >= len(trained_groups)


def test_failures_are_replaced_with_the_same_seed():
    fail = lambda t: t.trajectory_id.endswith("/1")  # noqa: E731 - every second member fails once
    h = Harness(rollout_cfg(), steps=3, fail=fail)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    assert h.sched.counts["failed"] >= 3 and h.sched.counts["replacements"] >= 3
    for _, batch in batches:
        seeds = {}
        for t in batch:
            seeds.setdefault(t.group_id, set()).add(t.task.seed)
        assert all(len(s) == 1 for s in seeds.values())


def test_stale_running_work_is_cancelled_when_the_batch_moves_on():
    # members of some groups are far slower than the rest: by the time they finish they are stale
    slow = lambda t: 0.5 if t.seed % 3 == 0 else 0.003  # noqa: E731
    h = Harness(rollout_cfg(alpha=0, redundancy=RedundancyConfig(extra_groups=2, selection="first")), steps=4, latency=slow)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    assert h.sched.counts["stale"] > 0


def test_a_group_dropped_stale_from_the_buffer_frees_its_admission_slot():
    # A ready group that turns stale while get_batch waits is dropped by the buffer; with nothing else
    # running, only that drop can wake admission to start the group the batch now needs.
    async def scenario():
        # α = 0, two groups per batch and two admitted at a time; resumed at version 1 with a group of
        # version 0 ready in the buffer, so admission starts one group beside it, then must wait
        h = Harness(rollout_cfg(alpha=0, get_batch_timeout_s=5), steps=3, latency=lambda t: 0.002)
        h.sched.admission.next_train_version = 1
        h.sched.set_inference_version(1)
        task = Task("old/0", "fast", "fast", 0, "old")
        old = tuple(Trajectory(f"old/{i}", task, 0, status=Status.COMPLETED, reward=1.0) for i in range(4))
        h.buffer.put(ReadyGroup("old", -1, "fast", old))
        h.sched.start()

        async def admitted_group_ready():
            while len(h.buffer.ready_groups) < 2:
                await asyncio.sleep(0.01)

        try:
            await asyncio.wait_for(admitted_group_ready(), 5)
            assert h.sched.pending_groups() == h.sched.allowed_groups() == 2
            return h, await h.sched.get_batch(1)  # drops "old", and needs one more group
        finally:
            await h.sched.stop()

    h, batch = asyncio.run(scenario())
    assert len(batch) == 8 and all(t.start_version == 1 for t in batch)
    assert h.sched.counts["stale"] == 4 and h.sched.counts["groups_started"] == 2


def test_stratified_selection_keeps_the_target_mix():
    slow_domain = lambda t: 0.05 if t.domain == "slow" else 0.002  # noqa: E731
    cfg = rollout_cfg(batch_size=16, redundancy=RedundancyConfig(selection="stratified", extra_groups=2))
    h = Harness(cfg, steps=3, latency=slow_domain)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    for _, batch in batches:
        domains = [t.domain for t in batch]
        assert domains.count("fast") == domains.count("slow") == 8


def test_stratified_admission_never_starves_a_domain_behind_over_quota_ready_groups():
    # 2:1 weights and two groups per batch: a batch needs one group of each domain, while more of the
    # heavier domain get admitted. Ready groups of one domain must not use up the room the other needs.
    domains = {"fast": DomainConfig(env="fast", weight=2.0), "slow": DomainConfig(env="slow", weight=1.0)}
    slow_domain = lambda t: 0.03 if t.domain == "slow" else 0.002  # noqa: E731
    cfg = rollout_cfg(get_batch_timeout_s=5, redundancy=RedundancyConfig(selection="stratified"))
    h = Harness(cfg, steps=6, latency=slow_domain, domains=domains)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    for _, batch in batches:
        assert sorted({t.domain for t in batch}) == ["fast", "slow"]


def test_get_batch_timeout_says_what_it_waits_for():
    h = Harness(rollout_cfg(get_batch_timeout_s=0.3), steps=2, latency=lambda t: 5.0)
    with pytest.raises(BatchTimeout, match=r"0/2 groups ready.*trajectories running"):
        asyncio.run(h.run())


def test_turn_barrier_advances_a_cohort_in_lock_step():
    async def scenario():
        barrier = LocalTurnBarrier(timeout_s=5)
        order = []

        async def member(tid, delays):
            for k, d in enumerate(delays):
                await barrier.before_turn(tid, k)
                order.append((k, tid))
                await asyncio.sleep(d)
            await barrier.leave(tid)

        for tid in "abc":
            await barrier.join(tid, cohort=0)
        await asyncio.gather(member("a", [0.0, 0.0, 0.0]), member("b", [0.05, 0.0, 0.0]),
                             member("c", [0.0, 0.1]))
        return order

    order = asyncio.run(scenario())
    turns = [k for k, _ in order]
    assert turns == sorted(turns), f"a trajectory ran ahead of its cohort: {order}"


def test_turn_barrier_run_with_the_scheduler():
    barrier = LocalTurnBarrier(timeout_s=10)
    h = Harness(rollout_cfg(alpha=0), steps=2, turn_barrier=barrier)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    alpha=st.integers(0, 2),
    mode=st.sampled_from(["trajectory", "token"]),
    extra_per_group=st.integers(0, 1),
    extra_groups=st.integers(0, 1),
    fail_p=st.sampled_from([0.0, 0.15]),
    score_fail=st.sampled_from([0.0, 0.1]),
    selection=st.sampled_from(["first", "stratified"]),
)
def test_property_staleness_bound_and_no_loss_under_random_latency_and_faults(
    seed, alpha, mode, extra_per_group, extra_groups, fail_p, score_fail, selection
):
    rng = random.Random(seed)
    lat = {}

    def latency(task):
        return lat.setdefault(task.trajectory_id, rng.expovariate(1 / 0.01))

    def fail(task):
        # a string seed, not hash(): str hashes differ between processes, so a failing case would not replay
        return random.Random(f"{seed}/{task.trajectory_id}").random() < fail_p

    cfg = rollout_cfg(alpha=alpha, staleness=mode,
                      redundancy=RedundancyConfig(extra_per_group=extra_per_group, extra_groups=extra_groups,
                                                 selection=selection))
    h = Harness(cfg, steps=4, seed=seed, latency=latency, fail=fail, score_fail=score_fail)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    assert len(batches) == 4


def test_a_failed_background_task_stops_rollout_within_a_second_naming_it():
    class BrokenTurnBarrier:  # the admission loop awaits it for every trajectory it starts
        async def join(self, trajectory_id, cohort):
            raise ConnectionError("turn barrier unreachable")

        async def before_turn(self, trajectory_id, turn):
            pass

        async def leave(self, trajectory_id):
            pass

    async def main():
        h = Harness(rollout_cfg(get_batch_timeout_s=600), steps=2, turn_barrier=BrokenTurnBarrier())
        h.sched.start()
        start = asyncio.get_running_loop().time()
        try:
            with pytest.raises(SchedulerFailed, match="the admission loop failed: ConnectionError") as info:
                await h.sched.get_batch(0)
        finally:
            await h.sched.stop()
        assert asyncio.get_running_loop().time() - start < 1.0  # not the 600 s of get_batch_timeout_s
        assert isinstance(info.value.__cause__, ConnectionError)  # its own error and traceback
        with pytest.raises(SchedulerFailed):  # and every later ask
            await h.sched.get_batch(0)
        # the trajectory whose join raised never ran: it ended in the ledger, not left running
        assert h.sched.fate and Fate.RUNNING not in h.sched.fate.values() and not h.runner.runs

    asyncio.run(main())


def test_a_replacement_that_its_groups_end_overtook_never_starts():
    """A FAILED member's replacement is launched in the background; a stop (or the group going stale) that
    closes the group first leaves it nothing to start — else it would run uncancelled past stop()."""
    async def main():
        h = Harness(rollout_cfg(), steps=1, latency=lambda t: 0.05)
        collection = h.sched.collection
        await collection.launch_group("fast", "fast", 0, 7, 0)
        group = h.sched.groups.by_id["g000000"]
        await collection.cancel_group(group, Status.STALE, "stale for batch 1")
        before = dict(h.sched.fate)
        await collection.launch_trajectory(group)  # the replacement spawned before the group closed
        assert h.sched.fate == before and group.launched == 4
        await h.sched.stop()
        assert Fate.RUNNING not in h.sched.fate.values() and h.sched.groups.unsettled == 0

    asyncio.run(main())


def test_a_group_closed_before_its_members_tasks_first_ran_starts_none_of_them():
    """A stop (or staleness) right after admission: the members' cancels would reach no runner (the env router
    does not know yet where they go), so the members must not start at all."""
    async def main():
        h = Harness(rollout_cfg(), steps=1, latency=lambda t: 5.0)
        collection = h.sched.collection
        await collection.launch_group("fast", "fast", 0, 7, 0)  # four tasks created, none has run yet
        group = h.sched.groups.by_id["g000000"]
        await collection.cancel_group(group, Status.STALE, "stale for batch 1")
        await h.sched.stop(timeout_s=2)
        assert not h.runner.runs and set(h.sched.fate.values()) == {Fate.STALE} and len(h.sched.fate) == 4
        assert h.sched.groups.unsettled == 0 and not h.sched.groups.by_id

    asyncio.run(main())


def test_a_member_whose_group_closed_while_it_joined_the_turn_barrier_never_runs():
    class SlowJoin(LocalTurnBarrier):
        def __init__(self):
            super().__init__(timeout_s=10)
            self.release = asyncio.Event()

        async def join(self, trajectory_id, cohort):
            await super().join(trajectory_id, cohort)
            await self.release.wait()

    async def main():
        barrier = SlowJoin()
        h = Harness(rollout_cfg(), steps=1, turn_barrier=barrier)
        collection = h.sched.collection
        group_launch = asyncio.create_task(collection.launch_group("fast", "fast", 0, 7, 0))
        await asyncio.sleep(0.01)  # the first member is in the ledger, joining
        group = h.sched.groups.by_id["g000000"]
        await collection.cancel_group(group, Status.ABORTED, "shutdown")  # its cancel reaches no runner
        barrier.release.set()
        await group_launch
        await h.sched.stop()
        assert h.sched.fate == {"g000000/0": Fate.ABORTED} and not h.runner.runs
        assert h.sched.groups.unsettled == 0 and "g000000" not in h.sched.groups.by_id
        assert not barrier._members  # it left the barrier

    asyncio.run(main())


def test_a_checkpoint_holds_scored_groups_that_a_resumed_scheduler_trains_as_they_were():
    async def main():
        ledger_sink = ListSink()
        h = Harness(rollout_cfg(alpha=1), steps=6, ledger_sink=ledger_sink)
        h.sched.start()
        first = []
        for k in range(2):  # the driver's loop, then a checkpoint while rollout goes on
            first.append((k, await h.sched.get_batch(k)))
            h.serve(k)
        for _ in range(200):
            if h.buffer.ready_groups:
                break
            await asyncio.sleep(0.01)
        state = json.loads(json.dumps(h.sched.state_dict()))  # JSON, nothing else
        await h.sched.stop()
        ready = {t.trajectory_id: t for g in h.buffer.ready_groups for t in g.trajectories}
        assert ready and {d for d, _, _ in state["replay"]} <= set(DOMAINS)
        assert not {s for _, s, _ in state["replay"]} & {g.seq for g in h.buffer.ready_groups}
        assert {e["fate"] for e in ledger_sink.entries} >= {"running", "ready", "trained"}
        digests = {e["id"]: e["digest"] for e in ledger_sink.entries if e["fate"] == "ready"}

        resumed = Harness(rollout_cfg(alpha=1), steps=4)
        resumed.sched.load_state_dict(state)
        resumed.serve(h.version)
        restored = {t.trajectory_id: t for g in resumed.buffer.ready_groups for t in g.trajectories}
        assert restored.keys() == ready.keys()
        for tid, traj in restored.items():
            assert traj.turns == ready[tid].turns and traj.reward == ready[tid].reward
            assert trajectory_digest(traj) == digests[tid]
        resumed.sched.start()
        trained = {}
        try:
            for k in (h.version, h.version + 1):
                trained.update({t.trajectory_id: t for t in await resumed.sched.get_batch(k)})
                resumed.serve(k)
        finally:
            await resumed.sched.stop()
        trained_before = {t.trajectory_id for _, b in first for t in b}
        assert restored.keys() <= trained.keys() and not trained_before & trained.keys()  # once, and only once
        assert all(trained[tid].turns == ready[tid].turns for tid in restored)  # as they were, not regenerated

    asyncio.run(main())


class ListSink:
    """A `LedgerSink` that keeps the entries (the run's ledger file writes them to disk)."""

    def __init__(self) -> None:
        self.entries: list[dict] = []

    def write(self, entry) -> None:
        self.entries.append(dict(entry))


def test_every_ledger_move_is_written_to_the_sink_as_it_happens_and_without_one_the_ledger_is_still_kept():
    """The scheduler writes each move to the sink it is given, at once (nothing to drain); what writes no
    ledger file (the cluster twin, bench rollout) gives none: the fates and their checks stay."""
    async def main():
        ledger_sink = ListSink()
        h = Harness(rollout_cfg(alpha=1), steps=2, ledger_sink=ledger_sink)
        h.sched.start()
        task = asyncio.ensure_future(h.sched.get_batch(0))
        while not ledger_sink.entries:
            await asyncio.sleep(0.001)
        assert all(e["fate"] == "running" for e in ledger_sink.entries)  # written as they started, batch not taken
        batch = await task
        await h.sched.stop()
        trained = [e["id"] for e in ledger_sink.entries if e["fate"] == "trained"]
        assert sorted(trained) == sorted(t.trajectory_id for t in batch)

        bare = Harness(rollout_cfg(alpha=1), steps=2)
        bare.sched.start()
        batch = await bare.sched.get_batch(0)
        await bare.sched.stop()
        assert batch and all(bare.sched.fate[t.trajectory_id] is Fate.TRAINED for t in batch)
        assert bare.sched.check_ledger() == []

    asyncio.run(main())


class _DeafRunner(FakeRunner):
    """Episodes that ignore cancels: only stop()'s local cancellation ends them."""

    async def cancel(self, trajectory_id: str, status: Status, reason: str) -> None:
        pass


def test_the_running_peak_counts_every_started_trajectory_and_runs_cancelled_locally_settle():
    async def scenario():
        h = Harness(rollout_cfg(alpha=1), steps=4)
        h.runner = h.sched.runner = h.sched.collection.runner = _DeafRunner(lambda: 0, latency=lambda t: 60.0)
        h.sched.start()
        for _ in range(200):  # admission fills the window: (α + 1) batches of 2 groups of 4
            await asyncio.sleep(0.005)
            if h.sched.groups.unsettled == h.bound:
                break
        assert h.sched.groups.unsettled == h.bound == h.sched.metrics()["rollout/running_peak"]
        await h.sched.stop(timeout_s=0.05)  # the deaf episodes are cancelled in their tasks
        await asyncio.sleep(0.01)
        assert h.sched.groups.unsettled == 0 and h.sched.metrics()["rollout/running_peak"] == h.bound

    asyncio.run(scenario())


@pytest.mark.parametrize("selection", ["first", "stratified"])
def test_the_group_admission_waits_for_is_forecast_to_the_runner_once_before_it_is_admitted(selection):
    domains = {"only": DomainConfig(env="only", weight=1.0)}
    h = Harness(rollout_cfg(alpha=0, redundancy=RedundancyConfig(selection=selection, extra_per_group=1)), steps=4,
                domains=domains)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    admitted = {g.task.group_id: g for g in h.runner.expected}
    assert len(admitted) == len(h.runner.expected) >= 3, "each forecast is told once"
    firsts = {t: i for i, t in enumerate(h.runner.runs)}
    for group_id, group in admitted.items():
        assert group.size == 5 and group.task.domain == "only" and group.task.env == "only"
        assert group.task.trajectory_id == f"{group_id}/0"
        if f"{group_id}/0" in firsts:  # the forecast came true: that group was admitted with that seed
            assert group.task.seed == h.sched.admission.seed * 1_000_003 + int(group_id[1:])
    assert sum(f"{g}/0" in firsts for g in admitted) >= len(admitted) - 1  # all but the last one in flight at the end
