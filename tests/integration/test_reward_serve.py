"""The serverless reward service on the shared local Ray (Ray Serve on 127.0.0.1): exactly-once under real
HTTP 500s, timeouts and dropped responses; auth and size refusals; scale to zero, then a cold start."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from rollart.config import DomainConfig, RewardConfig, RunConfig, ServerlessConfig
from rollart.reward import RewardRouter
from rollart.reward.client import HttpRewardClient
from rollart.reward.handler import ServiceFaults, claim_key
from rollart.reward.protocol import to_payload
from rollart.types import Task, Trajectory, Turn
from testutil import free_port

pytestmark = pytest.mark.ray



class DroppingTransport(httpx.AsyncBaseTransport):
    """Sends every request; loses the answer of some (the service did score them)."""

    def __init__(self, drop_prob: float, seed: int = 0) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.drop_prob, self.rng, self.dropped = drop_prob, random.Random(seed), 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if self.rng.random() < self.drop_prob:
            self.dropped += 1
            raise httpx.ReadError("injected: connection lost before the answer arrived", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def run_config() -> RunConfig:
    cfg = RunConfig(domains={
        "ret": DomainConfig(env="frozenlake", pool="gen_prefill", reward={"fn": "env", "backend": "serverless"}),
        "math": DomainConfig(env="math", reward={"fn": "math", "backend": "serverless"}),
    })
    cfg.reward = RewardConfig(
        timeout_s=1.0, retries=8, backoff_s=0.05, backoff_max_s=0.3, max_payload_mb=0.05,
        serverless=ServerlessConfig(min_replicas=0, max_replicas=2, downscale_delay_s=1.0, port=free_port()),
    )
    return cfg


def make_traj(i: int, domain: str = "ret") -> Trajectory:
    action = f"\\boxed{{{i}}}"
    return Trajectory(f"serve-{domain}-{i}", Task(f"k{i}", domain, domain, i, "g"), 0,
                      (Turn((), (), (), (), action=action),), env_return=float(i), reference={"answer": str(i)})


@pytest.fixture(scope="module")
def service(ray_local):
    from rollart.reward.service import RewardService

    svc = RewardService(run_config(), token="integration-token", app_name="rollart-reward-test",
                        faults=ServiceFaults(error_prob=0.2, delay_prob=0.1, delay_s=1.5, seed=7), poll_s=0.2)
    svc.start()
    # the first request waits for a replica to start (seconds on a loaded machine, more than the 1 s
    # client timeout of these tests): bring one up before the fault tests
    warm = json.dumps(to_payload(make_traj(-1), "env")).encode()
    with httpx.Client(timeout=120) as http:
        for _ in range(10):  # the injected faults apply to this request too
            if http.post(svc.url, content=warm, headers={"authorization": f"Bearer {svc.token}"}).status_code == 200:
                break
    yield svc
    svc.stop()


def test_exactly_once_under_500s_timeouts_and_drops(service):
    transport = DroppingTransport(0.2, seed=1)
    client = HttpRewardClient(service.url, service.cfg.reward, token=service.token, backend="serverless",
                              transport=transport, seed=2)
    trajs = [make_traj(i) for i in range(30)] + [make_traj(i, "math") for i in range(4)]

    async def score_all():
        try:
            return await asyncio.gather(*(client.score(t, "env" if t.domain == "ret" else "math") for t in trajs))
        finally:
            await client.aclose()

    results = asyncio.run(score_all())
    assert all(r.ok for r in results), ([(r.trajectory_id, r.attempts, r.error) for r in results if not r.ok], service.stats())
    assert [r.reward for r in results] == [float(i) for i in range(30)] + [1.0] * 4
    assert all(service.scorings(claim_key("", client.idempotency_key(t))) == 1 for t in trajs)
    stats = service.stats()
    assert stats["completed"] == len(trajs) and stats["duplicates"] == 0  # the warm-up had no key: not kept
    assert transport.dropped > 0 and stats["replays"] > 0
    assert client.stats.retries > transport.dropped  # the service's injected 500s and delays were retried too


def test_unauthenticated_and_oversized_requests_are_refused(service):
    body = json.dumps(to_payload(make_traj(1), "env")).encode()
    with httpx.Client(timeout=30) as http:
        anon = http.post(service.url, content=body)
        wrong = http.post(service.url, content=body, headers={"authorization": "Bearer wrong"})
        big = http.post(service.url, content=b"x" * 100_000, headers={"authorization": f"Bearer {service.token}"})
    assert (anon.status_code, anon.json()["code"]) == (401, "unauthorized")
    assert wrong.status_code == 401
    assert (big.status_code, big.json()["code"]) == (413, "payload_too_large")


def test_scale_to_zero_then_cold_start(service):
    deadline = time.monotonic() + 60
    while service.replicas.current > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert service.replicas.current == 0, "the service did not scale to zero within 60 s"
    starts_before = service.stats()["replica_starts"]
    router = RewardRouter(service.cfg, service=service)
    result = asyncio.run(router.score(make_traj(1000)))
    assert result.ok and result.reward == 1000.0 and result.details["cold_start"] is True
    metrics = router.metrics()
    assert metrics["reward/serverless/cold_starts"] >= 1 and metrics["reward/cold_starts"] >= 1
    assert metrics["reward/serverless/replica_starts"] > starts_before
    assert metrics["reward/serverless/replicas_max"] >= 1 and 0 < metrics["reward/serverless/pool_util"]
    assert metrics["reward/serverless/latency_p50_s"] > 0


def test_many_jobs_share_one_service_and_never_see_each_others_results(service):
    """Three jobs at once, each with its own job token and run id, the same trajectory ids and different
    payloads (injected faults and retries included): every job gets exactly its own results."""
    from rollart.reward import tokens
    from rollart.reward.router import new_run_id

    def job_traj(job: int, i: int) -> Trajectory:
        return Trajectory(f"g{i:06d}/0", Task(f"g{i:06d}/0", "ret", "ret", i, f"g{i:06d}"), 0,
                          (Turn((), (), (), (), action="a"),), env_return=1000.0 * job + i)

    clients = [HttpRewardClient(service.url, service.cfg.reward, token=tokens.issue(service.token, f"job{j}"),
                                backend="http", run_key=f"{new_run_id()}/0", seed=j) for j in range(3)]

    async def score_all():
        try:
            return await asyncio.gather(*(asyncio.gather(*(c.score(job_traj(j, i), "env") for i in range(12)))
                                          for j, c in enumerate(clients)))
        finally:
            for c in clients:
                await c.aclose()

    per_job = asyncio.run(score_all())
    for j, results in enumerate(per_job):
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        assert [r.reward for r in results] == [1000.0 * j + i for i in range(12)]  # cross_job_results = 0


def test_a_job_in_the_same_ray_cluster_attaches_to_the_shared_service(service):
    """`rollart serve-reward` registers a shared service; a job's router with a serverless domain attaches to
    it with a job token of its own instead of deploying a service."""
    from rollart.reward.service import SHARED_APP, RewardService

    shared = RewardService(service.cfg, token="shared-secret", app_name=SHARED_APP, route="/shared-test",
                           shared=True, poll_s=0.2)
    shared.start()
    try:
        with httpx.Client(timeout=120) as http:  # a cold start takes longer than these tests' 1 s client timeout
            assert http.get(shared.url).status_code == 200
        router = RewardRouter(service.cfg).start()
        try:
            assert router.service is None and router.serverless.url == shared.url
            assert router.serverless.token.startswith(f"rj1.run-{router.run_id[:16]}.")
            result = asyncio.run(router.score(make_traj(7)))
            assert result.ok and result.reward == 7.0 and result.backend == "serverless", result
        finally:
            router.stop()
        assert shared.stats()["completed"] == 1  # the job's scoring went to the shared service …
        with httpx.Client(timeout=120) as http:  # … which outlives the job
            assert http.get(shared.url).status_code == 200
    finally:
        shared.stop()
