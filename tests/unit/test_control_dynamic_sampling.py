"""Dynamic sampling (DAPO) through the real scheduler: a group the algorithm's filter rejects is dropped, counted
per domain and replaced by a newly admitted group; the drop is bounded per batch; the ledger stays exact under
α = 1 and across a checkpoint and resume; the twin runs the same filter."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter

from control_fakes import FakeScorer
from test_control_scheduler import DOMAINS, Harness, ListSink, check_invariants, rollout_cfg

from rollart.algo import reward_variance
from rollart.control import Fate
from rollart.observability.ledger import audit_ledger
from rollart.types import RewardResult


class ConstantEveryThirdSeed(FakeScorer):
    """Groups whose seed is a multiple of 3 score 1 for every member (no variance); others alternate 0/1."""

    async def score(self, trajectory):
        self.scored.append(trajectory.trajectory_id)
        await asyncio.sleep(0)
        if trajectory.task.seed % 3 == 0:
            return RewardResult(trajectory.trajectory_id, 1.0)
        return RewardResult(trajectory.trajectory_id, float(int(trajectory.trajectory_id.split("/")[-1]) % 2))


class AlwaysConstant(FakeScorer):
    async def score(self, trajectory):
        self.scored.append(trajectory.trajectory_id)
        await asyncio.sleep(0)
        return RewardResult(trajectory.trajectory_id, 0.0)


def filtered_groups(h: Harness) -> set[str]:
    return {tid.rsplit("/", 1)[0] for tid, fate in h.sched.fate.items() if fate is Fate.FILTERED}


def test_rejected_groups_are_dropped_counted_and_replaced_under_alpha_1():
    h = Harness(rollout_cfg(alpha=1), steps=5, latency=lambda t: 0.002 + (t.seed % 5) * 0.003,
                scorer=ConstantEveryThirdSeed(), group_filter=reward_variance, max_filtered=100)
    batches = asyncio.run(h.run())
    check_invariants(h, batches)  # full batches of whole, fresh groups; every trajectory ends exactly once
    for _, batch in batches:
        by_group: dict[str, set[float]] = {}
        for t in batch:
            by_group.setdefault(t.group_id, set()).add(t.reward)
        assert all(len(rewards) > 1 for rewards in by_group.values()), "a constant-reward group was trained"
    dropped = filtered_groups(h)
    assert dropped, "no group was filtered: the test would be vacuous"
    metrics = h.sched.metrics()
    per_domain = {d: metrics[f"rollout/groups_filtered/{d}"] for d in DOMAINS}
    assert sum(per_domain.values()) == metrics["rollout/groups_filtered"] == len(dropped)
    assert metrics["rollout/filter_bypassed"] == 0
    # the refill: more groups were admitted than trained, exactly the dropped ones (and the stragglers' groups)
    trained_groups = {t.group_id for _, b in batches for t in b}
    assert not dropped & trained_groups
    assert h.sched.counts["groups_started"] >= len(trained_groups) + len(dropped)
    assert "filtered" in h.sched.describe()


def test_the_filter_is_bounded_per_batch_and_says_so(caplog):
    h = Harness(rollout_cfg(alpha=1, get_batch_timeout_s=20), steps=3, scorer=AlwaysConstant(),
                group_filter=reward_variance, max_filtered=3)
    with caplog.at_level(logging.INFO, logger="rollart.control"):
        batches = asyncio.run(h.run())
    check_invariants(h, batches)  # it never spins: every batch came, from groups taken unfiltered
    metrics = h.sched.metrics()
    assert metrics["rollout/groups_filtered"] <= 3 * len(batches) + 3  # at most the bound per batch formed
    assert metrics["rollout/filter_bypassed"] >= 2 * len(batches) - 2
    said = [r for r in caplog.records if "train.max_filtered_groups" in r.getMessage()]
    assert 1 <= len(said) <= len(batches) + 1  # once per batch whose bound was hit


def test_without_a_filter_nothing_is_filtered_and_no_filter_metric_appears():
    h = Harness(rollout_cfg(alpha=1), steps=3, scorer=AlwaysConstant())
    batches = asyncio.run(h.run())
    check_invariants(h, batches)
    assert not filtered_groups(h) and "rollout/groups_filtered" not in h.sched.metrics()


def test_a_resumed_filtering_run_keeps_the_ledger_exact(tmp_path):
    async def main():
        sink = ListSink()
        h = Harness(rollout_cfg(alpha=1), steps=6, scorer=ConstantEveryThirdSeed(), group_filter=reward_variance,
                    max_filtered=100, ledger_sink=sink)
        h.sched.start()
        trained = []
        for k in range(2):
            trained += await h.sched.get_batch(k)
            h.serve(k)
        await asyncio.sleep(0.05)  # groups complete and are filtered while the checkpoint is taken
        state = json.loads(json.dumps(h.sched.state_dict()))
        cut = len(sink.entries)  # what the checkpoint covers: the run's ledger file is cut back here on resume
        await h.sched.stop()
        assert "filtered" in state

        resumed_sink = ListSink()
        r = Harness(rollout_cfg(alpha=1), steps=4, scorer=ConstantEveryThirdSeed(), group_filter=reward_variance,
                    max_filtered=100, ledger_sink=resumed_sink)
        r.sched.load_state_dict(state)
        assert r.sched.collection.filtered_this_batch == state["filtered"]
        r.serve(h.version)
        r.sched.start()
        try:
            for k in (h.version, h.version + 1):
                trained += await r.sched.get_batch(k)
                r.serve(k)
        finally:
            await r.sched.stop()
        return sink.entries[:cut] + resumed_sink.entries, trained

    entries, trained = asyncio.run(main())
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    audit = audit_ledger(path)
    assert audit.broken == () and audit.lost == ()
    assert audit.fates["filtered"] > 0 and audit.fates["trained"] == len(trained) == 4 * 8
    assert len({t.trajectory_id for t in trained}) == len(trained)
    filtered_ids = {e["id"] for e in entries if e["fate"] == "filtered"}
    assert not filtered_ids & {t.trajectory_id for t in trained}


def test_the_twin_runs_the_filter_and_counts_what_it_dropped():
    from rollart.config import RunConfig
    from rollart.sim.calibration import build_machine, frozenlake_tiny, with_profiles
    from rollart.sim.run import simulate

    base = with_profiles(RunConfig(), frozenlake_tiny(2))
    profiled = {d: dc.model_copy(update={"profile": dc.profile.model_copy(update={"success_rate": 0.5})})
                for d, dc in base.domains.items()}
    runs = {}
    for algorithm in ("grpo", "dapo"):
        cfg = RunConfig.model_validate({**base.model_dump(), "domains": {d: dc.model_dump() for d, dc in profiled.items()},
                                        "train": {"steps": 3, "algorithm": algorithm}})
        runs[algorithm] = simulate(cfg, build_machine())
    grpo, dapo = runs["grpo"], runs["dapo"]
    assert grpo.ledger_violations == dapo.ledger_violations == []
    assert "rollout/groups_filtered" not in grpo.counters
    assert dapo.counters["rollout/groups_filtered"] > 0 and dapo.extra["fates"].get("filtered", 0) > 0
    assert Counter(grpo.extra["fates"]).get("filtered", 0) == 0
    # the refill costs rollout: dapo generated more trajectories for the same trained ones
    assert sum(dapo.extra["fates"].values()) > sum(grpo.extra["fates"].values())
