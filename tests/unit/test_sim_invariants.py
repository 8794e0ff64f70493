"""Invariants of the production control plane hold in twin runs with faults: every trajectory ends exactly
once (the scheduler's ledger), no batch holds a trajectory staler than α, and the batches are full — with the
trainer's devices lent to generation too (turns taken back go on elsewhere, per-token staleness holds)."""

import pytest

from rollart.config.loader import load_config
from rollart.sim.hardware import SimHardware
from rollart.sim.run import simulate

HW = SimHardware.model_validate({"model": "qwen3-8b", "pools": {
    "gen_prefill": {"gpu": "H800", "count": 2}, "gen_decode": {"gpu": "H20", "count": 4},
    "train": {"gpu": "H800", "count": 8}}, "weights": {"link": "rdma_400g"}})


@pytest.mark.parametrize("alpha,staleness,elastic", [(1, "trajectory", False), (2, "token", False),
                                                     (0, "trajectory", False), (1, "token", True)])
def test_ledger_and_staleness_hold_under_injected_faults(alpha: int, staleness: str, elastic: bool) -> None:
    faults = "{dist: lognormal, mean_s: 2.0, std_s: 3.0}"
    cfg = load_config(None, [
        "train.steps=8", "rollout.batch_size=32", "rollout.group_size=4", f"rollout.alpha={alpha}",
        f"rollout.staleness={staleness}", "rollout.redundancy.extra_per_group=1", "rollout.redundancy.extra_groups=2",
        f"domains.frozenlake.inject={{step_latency: {faults}, step_fail_prob: 0.05, reset_fail_prob: 0.3}}",
        "domains.frozenlake.profile={turns: {dist: gaussian, mean: 5, std: 2}, prompt_tokens: {mean: 800}, "
        "obs_tokens: {mean: 200}, response_tokens: {dist: lognormal, mean: 120, std: 100}}",
        "domains.math.inject={reset_fail_prob: 0.1}",
        "domains.math.profile={response_tokens: {dist: lognormal, mean: 1500, std: 1500}, reward: {dist: constant, mean_s: 1.0}}",
        "domains.math.max_new_tokens=8000", "domains.math.max_total_tokens=16000",
        "domains.frozenlake.max_total_tokens=16000", "domains.frozenlake.max_new_tokens=1000",
        f"train.elastic_generation={str(elastic).lower()}",
    ])
    report = simulate(cfg, HW)
    if elastic:  # the trainer's devices generated between train steps, and turns went on elsewhere when taken back
        assert report.trainer_lent_busy_s > 0
        assert sum(s.get("train/lent_preempted_turns", 0) for s in report.steps) > 0
    assert report.ledger_violations == []
    assert report.staleness_violations == []
    assert len(report.steps) == 8 and all(s["trajectories"] == 32 for s in report.steps)
    assert all(s["max_staleness"] <= alpha for s in report.steps)
    # the batch wait with no train step in flight is part of the batch wait (sync: all of it)
    assert all(0 <= s["time/get_batch_idle"] <= s["time/get_batch_wait"] + 1e-9 for s in report.steps)
    if alpha == 0:
        assert all(s["time/get_batch_idle"] == pytest.approx(s["time/get_batch_wait"]) for s in report.steps)
    fates = report.extra["fates"]
    assert fates.get("running", 0) == 0  # everything started has ended
    assert fates["trained"] == 8 * 32
    assert report.counters["buffer/failed"] > 0 and report.counters["rollout/replacements"] > 0  # faults happened
    assert fates.get("aborted", 0) > 0  # redundant stragglers were cancelled
