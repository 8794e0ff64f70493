"""Latency distributions and injected failures of the fault-injection wrapper."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest

from rollart.config import FaultInjectionConfig, LatencyConfig
from rollart.envs import AsyncEnv, FaultInjectingEnv, InjectedFault, make_env, sample_latency


def draws(cfg: LatencyConfig, n: int = 20000) -> list[float]:
    rng = random.Random(0)
    return [sample_latency(cfg, rng) for _ in range(n)]


def test_constant_and_none():
    assert set(draws(LatencyConfig(dist="constant", mean_s=0.3), 10)) == {0.3}
    assert set(draws(LatencyConfig(dist="none", mean_s=0.3), 10)) == {0.0}


@pytest.mark.parametrize("dist", ["gaussian", "lognormal"])
def test_distributions_have_the_configured_mean_and_std(dist):
    xs = draws(LatencyConfig(dist=dist, mean_s=1.0, std_s=0.3))
    assert min(xs) >= 0
    assert statistics.fmean(xs) == pytest.approx(1.0, rel=0.03)
    assert statistics.pstdev(xs) == pytest.approx(0.3, rel=0.05)


def test_gaussian_is_clipped_at_zero():
    xs = draws(LatencyConfig(dist="gaussian", mean_s=0.1, std_s=1.0), 2000)
    assert min(xs) == 0.0 and max(xs) > 0.1


def test_failure_probability_is_honoured_and_draws_differ_across_envs():
    rng = random.Random(1)
    cfg = FaultInjectionConfig(reset_fail_prob=0.5)

    async def resets(n: int) -> int:
        failures = 0
        for seed in range(n):
            env = FaultInjectingEnv(AsyncEnv(make_env("math")), cfg, rng)  # shared rng: a retry draws anew
            try:
                await env.reset(seed)
            except InjectedFault:
                failures += 1
        return failures

    failures = asyncio.run(resets(400))
    assert 150 < failures < 250


def test_wrapper_passes_through_when_nothing_is_injected():
    async def episode():
        env = FaultInjectingEnv(AsyncEnv(make_env("math")), FaultInjectionConfig(), random.Random(0))
        obs, info = await env.reset(3)
        result = await env.step("\\boxed{" + info["reference"]["answer"] + "}")
        await env.close()
        return result

    obs, reward, terminated, truncated, info = asyncio.run(episode())
    assert terminated and reward == 0.0
