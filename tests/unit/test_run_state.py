"""RunState, what a checkpoint carries for the driver: it survives the trainer's checkpoint file, and a
scheduler resumed from it re-admits the groups that were never trained, then draws on as the first would."""

from __future__ import annotations

import asyncio

from control_fakes import FakeRunner, FakeScorer
from test_control_scheduler import DOMAINS, rollout_cfg

from rollart.control import RolloutScheduler, SampleBuffer, StalenessPolicy
from rollart.trainer.checkpoint import load_extra, save_extra
from rollart.types import RunState


def make_scheduler(runner: FakeRunner, first_version: int = 0) -> RolloutScheduler:
    rollout = rollout_cfg(alpha=1)
    policy = StalenessPolicy(rollout.alpha, rollout.staleness)
    buffer = SampleBuffer(policy, rollout.redundancy.selection, {d: c.weight for d, c in DOMAINS.items()})
    return RolloutScheduler(rollout, DOMAINS, runner, FakeScorer(), buffer, policy, total_batches=8,
                            first_version=first_version, seed=3)


class RecordingRunner(FakeRunner):
    """A FakeRunner that remembers each group's (domain, seq) in the order the groups were started."""

    def __init__(self, version) -> None:
        super().__init__(version)
        self.groups: list[tuple[str, int]] = []

    async def run(self, task, start_version):
        group = (task.domain, int(task.group_id[1:]))
        if group not in self.groups:
            self.groups.append(group)
        return await super().run(task, start_version)


def test_a_fresh_run_has_an_empty_state_and_a_state_survives_the_checkpoint_file(tmp_path):
    assert RunState.from_checkpoint({}) == RunState(step=0, scheduler=None, eval_first=None)

    async def scheduler_state():
        sched = make_scheduler(FakeRunner(lambda: 0))
        sched.start()
        await sched.get_batch(0)
        state = sched.state_dict()
        await sched.stop()
        return state

    state = RunState(step=1, scheduler=asyncio.run(scheduler_state()), eval_first={"math": 0.25, "lake": 0.5})
    save_extra(tmp_path, state.to_checkpoint())  # what the trainer does with it
    assert RunState.from_checkpoint(load_extra(tmp_path)) == state


def test_a_resumed_scheduler_keeps_the_scored_groups_replays_the_running_then_draws_as_the_first_would():
    async def first_run():
        sched = make_scheduler(FakeRunner(lambda: 0))
        sched.start()
        await sched.get_batch(0)
        state = sched.state_dict()
        # what the first run would admit next, from the same random state (state_dict leaves it be)
        domains = sorted(DOMAINS)
        following = [(sched.admission.rng.choices(domains, [DOMAINS[d].weight for d in domains])[0], state["next_seq"] + i)
                     for i in range(2)]
        await sched.stop()
        return state, following

    async def resumed_run(state):
        version = 1
        runner = RecordingRunner(lambda: version)
        sched = make_scheduler(runner, first_version=1)
        sched.load_state_dict(state)
        sched.set_inference_version(1)
        sched.start()
        for k in (1, 2):
            await sched.get_batch(k)
            version = k + 1
            sched.set_inference_version(version)
        await sched.stop()
        assert sched.check_ledger() == []
        return runner.groups

    state, following = asyncio.run(first_run())
    replay = [(d, seq) for d, seq, _ in state["replay"]]  # still running: generated again
    ready = [(g["domain"], g["seq"]) for g in state["ready"]]  # scored: trained as they are
    assert replay or ready, "the first run left no group untrained: nothing to carry over"
    groups = asyncio.run(resumed_run(state))
    assert groups[: len(replay) + len(following)] == replay + following
    assert not set(ready) & set(groups)  # never generated again


def test_a_dataset_domain_draws_its_rows_in_order_and_a_resume_goes_on_at_the_next_row():
    """A dataset domain's groups carry its ordinals as seeds (the env maps ordinal → row of the epoch's
    shuffle): 0, 1, 2 … with no gap or repeat, the running ones replayed with theirs, then the next."""
    from rollart.config import DatasetConfig, DomainConfig

    data = DatasetConfig(train="rows.jsonl", columns={"prompt": "q", "answer": "a"})
    domains = {"rows": DomainConfig(env="dataset", data=data), "fast": DOMAINS["fast"]}

    def scheduler(runner, first_version=0):
        rollout = rollout_cfg(alpha=1)
        policy = StalenessPolicy(rollout.alpha, rollout.staleness)
        buffer = SampleBuffer(policy, rollout.redundancy.selection, {d: c.weight for d, c in domains.items()})
        return RolloutScheduler(rollout, domains, runner, FakeScorer(), buffer, policy, total_batches=8,
                                first_version=first_version, seed=3)

    class Seeds(FakeRunner):
        def __init__(self, version, known=()) -> None:
            super().__init__(version)
            self.seeds: dict[str, int] = {}  # group id → seed, dataset domain only
            self.known = set(known)  # groups of an earlier run: a group not among them is a fresh row
            self.fresh_row = asyncio.Event()

        async def run(self, task, start_version):
            if task.domain == "rows":
                assert self.seeds.setdefault(task.group_id, task.seed) == task.seed  # one row per group
                if task.group_id not in self.known:
                    self.fresh_row.set()
            return await super().run(task, start_version)

    async def first_run():
        runner = Seeds(lambda: 0)
        sched = scheduler(runner)
        sched.start()
        await sched.get_batch(0)
        state = sched.state_dict()
        await sched.stop()
        return runner.seeds, state

    async def resumed(state, first_groups):
        version = [1]
        runner = Seeds(lambda: version[0], known=first_groups)
        sched = scheduler(runner, first_version=1)
        sched.load_state_dict(state)
        sched.set_inference_version(1)
        sched.start()
        # A batch may fill from replayed groups and the other domain alone (it did on a loaded CI
        # machine): train on, batch after batch (bounded by the run's 8), until a row of its own is drawn.
        for k in range(1, 8):
            await sched.get_batch(k)
            if runner.fresh_row.is_set():
                break
            version[0] = k + 1
            sched.set_inference_version(k + 1)
        await sched.stop()
        return runner.seeds

    first, state = asyncio.run(first_run())
    assert sorted(first.values()) == list(range(len(first))) and state["ordinals"] == {"rows": len(first)}
    replayed = {g for d, seq, _ in state["replay"] if d == "rows" for g in [f"g{seq:06d}"]}
    second = asyncio.run(resumed(state, set(first)))
    assert {g: second[g] for g in replayed if g in second} == {g: first[g] for g in replayed if g in second}
    new = sorted(seed for g, seed in second.items() if g not in first)
    assert new and new == list(range(len(first), len(first) + len(new)))  # the next rows, none twice
