"""RewardRouter on the local backend: dispatch by domain, retries, timeouts, bounded concurrency, failures
as results, custom callables, config checks, metrics."""

from __future__ import annotations

import asyncio

import pytest

from rollart.config import DomainConfig, RewardConfig, RunConfig
from rollart.reward import RewardRouter
from rollart.types import RewardScorer, Task, Trajectory, Turn

STATE = {"flaky": 0, "active": 0, "peak": 0}


def flaky_reward(trajectory):
    STATE["flaky"] += 1
    if STATE["flaky"] < 3:
        raise RuntimeError("transient")
    return 0.5


async def slow_reward(trajectory):
    await asyncio.sleep(5)
    return 1.0


async def tracked_reward(trajectory):
    STATE["active"] += 1
    STATE["peak"] = max(STATE["peak"], STATE["active"])
    await asyncio.sleep(0.02)
    STATE["active"] -= 1
    return 1.0


def config(**domains) -> RunConfig:
    cfg = RunConfig(domains={name: DomainConfig(env="math", reward={"fn": fn, "backend": "local"})
                             for name, fn in domains.items()})
    cfg.reward = RewardConfig(retries=3, backoff_s=0.001, backoff_max_s=0.002, timeout_s=0.3, max_in_flight=3)
    return cfg


def traj(domain: str, action: str = "\\boxed{42}", i: int = 0, reference=None) -> Trajectory:
    return Trajectory(f"{domain}-{i}", Task("k", domain, "math", i, "g"), 0,
                      (Turn((), (), (), (), action=action),), env_return=0.25,
                      reference=reference if reference is not None else {"answer": "42"})


def test_router_is_a_reward_scorer_and_dispatches_by_domain():
    cfg = config(math="math", env="env", fmt="format")
    # Dispatch, not timeouts, is under test: the first math call starts math-verify's process pool, which
    # takes longer than the 0.3 s the timeout tests use when the machine is loaded.
    cfg.reward.timeout_s = 30.0
    with RewardRouter(cfg) as router:
        assert isinstance(router, RewardScorer)
        math_ok = asyncio.run(router.score(traj("math")))
        env = asyncio.run(router.score(traj("env")))
        fmt = asyncio.run(router.score(traj("fmt")))
        unknown = asyncio.run(router.score(traj("nope")))
    assert (math_ok.ok, math_ok.reward, math_ok.backend) == (True, 1.0, "local")
    assert env.reward == 0.25 and env.details["per_turn"] == (0.0,)
    assert fmt.reward == 1.0
    assert not unknown.ok and "nope" in unknown.error


def test_local_retries_then_succeeds():
    STATE["flaky"] = 0
    router = RewardRouter(config(f=f"{__name__}:flaky_reward"))
    res = asyncio.run(router.score(traj("f")))
    assert res.ok and res.reward == 0.5 and res.attempts == 3
    assert router.metrics()["reward/local/retries"] == 2.0


def test_failures_and_timeouts_become_failed_results():
    router = RewardRouter(config(math="math", slow=f"{__name__}:slow_reward"))
    missing = asyncio.run(router.score(traj("math", reference={})))
    slow = asyncio.run(router.score(traj("slow")))
    router.stop()
    # a trajectory the reward cannot score (RewardInputError) is not retried; a timeout is
    assert not missing.ok and missing.attempts == 1 and "reference['answer']" in missing.error
    assert slow.attempts == 4
    assert not slow.ok and "timed out" in slow.error
    metrics = router.metrics()
    assert metrics["reward/local/failures"] == 2.0 and metrics["reward/failures"] == 2.0


def test_in_flight_is_bounded():
    STATE.update(active=0, peak=0)
    router = RewardRouter(config(t=f"{__name__}:tracked_reward"))

    async def many():
        return await asyncio.gather(*(router.score(traj("t", i=i)) for i in range(12)))

    assert all(r.ok for r in asyncio.run(many()))
    assert STATE["peak"] == 3


def test_config_errors_are_caught_before_scoring():
    with pytest.raises(ValueError, match="domains.m.reward.fn"):
        RewardRouter(config(m="mathx"))
    with pytest.raises(ValueError, match="cannot be loaded"):
        RewardRouter(config(m="no_such_module_q:fn"))
    cfg = config(m="math")
    cfg.domains["m"].reward.backend = "http"
    with pytest.raises(ValueError, match="reward.http.url"):
        RewardRouter(cfg)


def test_serverless_domain_without_start_fails_softly():
    cfg = config(m="math")
    cfg.domains["m"].reward.backend = "serverless"
    res = asyncio.run(RewardRouter(cfg).score(traj("m")))
    assert not res.ok and "start()" in res.error


def test_metrics_are_namespaced_with_latency_percentiles():
    router = RewardRouter(config(env="env"))

    async def some():
        return await asyncio.gather(*(router.score(traj("env", i=i)) for i in range(5)))

    asyncio.run(some())
    m = router.metrics()
    assert all(k.startswith("reward/") for k in m)
    assert m["reward/local/requests"] == 5.0 and 0 < m["reward/local/latency_p50_s"] <= m["reward/local/latency_p95_s"]
    assert 0 <= m["reward/local/util"] <= 1


def test_serverless_pool_must_be_a_declared_serverless_pool():
    cfg = config(m="math")
    cfg.domains["m"].reward.backend = "serverless"
    cfg.reward.serverless.pool = "env"
    with pytest.raises(ValueError, match="reward.serverless.pool"):
        RewardRouter(cfg)
