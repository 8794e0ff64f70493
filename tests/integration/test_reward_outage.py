"""A reward service that goes down costs retries, not trajectories (on the shared local Ray): its app is
deleted under a running router; the next scoring finds it gone, the router deploys it again and the
scoring succeeds — counted in `reward/serverless/restarts` and `outage_retries`. Past
`reward.outage_budget_s` a scoring fails as before."""

from __future__ import annotations

import asyncio

import pytest
from ray import serve
from testutil import free_port

from rollart.config import DomainConfig, RewardConfig, RunConfig, ServerlessConfig
from rollart.reward import RewardRouter
from rollart.types import Task, Trajectory, Turn

pytestmark = pytest.mark.ray


def trajectory(i: int) -> Trajectory:
    return Trajectory(f"outage-{i}", Task(f"outage-{i}", "math", "math", i, "g"), 0,
                      (Turn((), (), (), (), action=f"\\boxed{{{i}}}"),), reference={"answer": str(i)})


def test_a_dead_reward_service_is_brought_back_and_the_scoring_survives(ray_local):
    cfg = RunConfig(domains={"math": DomainConfig(env="math", reward={"fn": "math", "backend": "serverless"})})
    cfg.reward = RewardConfig(timeout_s=5.0, retries=0, backoff_s=0.05, backoff_max_s=0.5, outage_budget_s=90.0,
                              serverless=ServerlessConfig(min_replicas=1, max_replicas=1, port=free_port()))
    with RewardRouter(cfg) as router:
        first = asyncio.run(router.score(trajectory(1)))
        assert first.ok and first.reward == 1.0
        serve.delete(router.service.app_name)  # the service dies under the router
        second = asyncio.run(router.score(trajectory(2)))
        assert second.ok and second.reward == 1.0, second.error
        m = router.metrics()
        assert m["reward/serverless/restarts"] == 1 and m["reward/serverless/outage_retries"] >= 1
        assert m["reward/failures"] == 0

        router.cfg.reward.outage_budget_s = 0.0  # no budget: an outage fails the scoring after `retries`
        serve.delete(router.service.app_name)
        third = asyncio.run(router.score(trajectory(3)))
        assert not third.ok and "HTTP 404" in third.error
