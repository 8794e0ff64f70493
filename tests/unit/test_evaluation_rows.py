"""Evaluation: a dataset domain with fewer validation rows than `eval.episodes_per_domain` scores each row once (and
says so); a domain whose reward function keeps raising stops the evaluation at once with its first traceback,
never retried as if it were an outage; an outage is still retried."""

from __future__ import annotations

import asyncio
import logging

import pytest
from control_fakes import FakeRunner

from rollart.config import RunConfig
from rollart.control import DomainBroken
from rollart.job.evaluation import announce_episodes, episodes, evaluate
from rollart.types import Fault, RewardResult, Trajectory


class Scorer:
    def __init__(self, broken: str = "", outage: int = 0) -> None:
        self.broken, self.outage, self.calls = broken, outage, 0

    async def score(self, traj: Trajectory) -> RewardResult:
        self.calls += 1
        if traj.domain == self.broken:
            try:
                raise TypeError("reward() missing 1 required positional argument: 'ground_truth'")
            except TypeError as exc:
                return RewardResult(traj.trajectory_id, 0.0, ok=False, error="raised", fault=Fault.of("reward", exc))
        if self.outage:
            self.outage -= 1
            return RewardResult(traj.trajectory_id, 0.0, ok=False, error="HTTP 503")  # no fault: retried
        return RewardResult(traj.trajectory_id, 1.0)


def cfg() -> RunConfig:
    return RunConfig(eval={"episodes_per_domain": 64, "retries": 2})


def test_fewer_validation_rows_than_episodes_are_each_scored_once(caplog: pytest.LogCaptureFixture) -> None:
    runner = FakeRunner(lambda: 0, latency=lambda task: 0.0)
    result = asyncio.run(evaluate(cfg(), runner, Scorer(), 0, "first", rows={"math": 40}))
    seeds = sorted(int(tid.rsplit("/", 1)[1]) for tid in runner.runs if "/math/" in tid)
    assert seeds == list(range(40))  # rows 0..39 once each, never 40..63 (which would repeat 0..23)
    assert result.scored == {"frozenlake": 64, "math": 40}
    assert episodes(cfg(), {"math": 40, "gsm": 100}) == {"frozenlake": 64, "math": 40}
    with caplog.at_level(logging.INFO, logger="rollart"):
        announce_episodes(cfg(), {"math": 40})
    assert "domain math has 40 validation rows, fewer than eval.episodes_per_domain=64: each row is scored once" \
        in caplog.text


def test_a_reward_function_that_keeps_raising_stops_the_evaluation_with_its_traceback() -> None:
    runner = FakeRunner(lambda: 0, latency=lambda task: 0.01)
    scorer = Scorer(broken="math")
    with pytest.raises(DomainBroken) as info:
        asyncio.run(evaluate(cfg(), runner, scorer, 0, "first"))
    message = str(info.value)
    assert message.startswith("domain 'math' is broken") and message.count("Traceback (most recent call last)") == 1
    assert "missing 1 required positional argument: 'ground_truth'" in message
    math_runs = [tid for tid in runner.runs if "/math/" in tid]
    assert not any("~" in tid for tid in math_runs)  # the function's own failure is never run again


def test_an_outage_is_still_retried() -> None:
    runner = FakeRunner(lambda: 0, latency=lambda task: 0.0)
    result = asyncio.run(evaluate(cfg(), runner, Scorer(outage=5), 0, "first"))
    assert result.scored == {"frozenlake": 64, "math": 64} and sum(result.failed.values()) == 0
    assert sum("~" in tid for tid in runner.runs) == 5
