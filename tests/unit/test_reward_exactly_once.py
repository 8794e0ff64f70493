"""Exactly-once scoring without Ray: the service's handler behind an in-process ASGI app, reached by the
real HTTP client through a transport that injects HTTP 500s, dropped responses and timeouts."""

from __future__ import annotations

import asyncio
import json
import random
import threading

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollart.config import DomainConfig, RewardConfig, RunConfig
from rollart.reward.client import HttpRewardClient, backoff_delay
from rollart.reward.handler import RewardHandler, ServiceFaults, claim_key
from rollart.reward.claims import SharedClaimBook
from rollart.reward.protocol import to_payload
from rollart.types import Task, Trajectory, Turn

TOKEN = "test-token"
CALLS: dict[str, int] = {}
CALLS_LOCK = threading.Lock()


async def counting_reward(trajectory):
    """Scores len(action); counts how often each trajectory was really scored."""
    with CALLS_LOCK:
        CALLS[trajectory.trajectory_id] = CALLS.get(trajectory.trajectory_id, 0) + 1
    await asyncio.sleep(0.01)
    return float(len(trajectory.turns[-1].action))


def run_config(**reward) -> RunConfig:
    cfg = RunConfig(domains={"count": DomainConfig(env="math", reward=f"{__name__}:counting_reward")})
    cfg.reward = RewardConfig(**{"retries": 10, "backoff_s": 0.001, "backoff_max_s": 0.01, "timeout_s": 2.0, **reward})
    return cfg


def make_traj(i: int) -> Trajectory:
    return Trajectory(f"traj-{i}", Task(f"task-{i}", "count", "math", i, "g"), 0,
                      (Turn((), (), (), (), action="x" * (i % 7 + 1)),))


def make_app(handler: RewardHandler) -> Starlette:
    async def endpoint(request):
        status, body = await handler.handle(request.headers, request.stream())
        return JSONResponse(body, status_code=status)

    return Starlette(routes=[Route("/reward", endpoint, methods=["POST"])])


class FaultyTransport(httpx.AsyncBaseTransport):
    """Per request: a 500 before the service sees it, a response dropped after the service answered,
    a timeout after the service answered, or a normal round trip (weights in `plan`)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, plan: dict[str, float], seed: int = 0) -> None:
        self.inner, self.plan, self.rng = inner, plan, random.Random(seed)
        self.injected = {k: 0 for k in plan}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        roll, fault = self.rng.random(), "ok"
        for name, p in self.plan.items():
            if roll < p:
                fault = name
                break
            roll -= p
        if fault == "http500":
            self.injected[fault] += 1
            return httpx.Response(500, json={"error": "injected", "code": "injected"})
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if fault == "drop":
            self.injected[fault] += 1
            raise httpx.RemoteProtocolError("server disconnected without sending a response", request=request)
        if fault == "timeout":
            self.injected[fault] += 1
            raise httpx.ReadTimeout("injected read timeout", request=request)
        return response


def setup(cfg: RunConfig, faults: ServiceFaults | None = None):
    claims = SharedClaimBook(int(cfg.reward.dedupe_max_mb * 2**20), cfg.reward.dedupe_ttl_s, lease_s=30)
    handler = RewardHandler(cfg, claims, token=TOKEN, replica="reward/reward/test", faults=faults)
    return claims, handler, httpx.ASGITransport(app=make_app(handler))


def test_every_trajectory_scored_exactly_once_under_injected_faults():
    CALLS.clear()
    cfg = run_config()
    claims, _, asgi = setup(cfg, ServiceFaults(error_prob=0.2, seed=1))
    transport = FaultyTransport(asgi, {"http500": 0.2, "drop": 0.2, "timeout": 0.15}, seed=3)
    client = HttpRewardClient("http://reward.test/reward", cfg.reward, token=TOKEN, transport=transport, seed=0)
    trajs = [make_traj(i) for i in range(60)]

    async def score_all():
        return await asyncio.gather(*(client.score(t, "count") for t in trajs))

    results = asyncio.run(score_all())
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert [r.reward for r in results] == [float(i % 7 + 1) for i in range(60)]
    assert all(CALLS[t.trajectory_id] == 1 for t in trajs) and len(CALLS) == 60
    assert all(claims.scorings(claim_key("", client.idempotency_key(t))) == 1 for t in trajs)
    stats = claims.stats()
    assert stats["completed"] == 60 and stats["duplicates"] == 0
    assert min(transport.injected.values()) > 0 and client.stats.retries > 0
    assert stats["replays"] > 0 and client.stats.replays > 0  # retries after a lost answer were replayed
    assert max(r.attempts for r in results) > 1


def test_concurrent_duplicates_wait_for_one_scoring():
    CALLS.clear()
    cfg = run_config()
    claims, handler, _ = setup(cfg)
    body = json.dumps(to_payload(make_traj(3), "count")).encode()
    headers = {"authorization": f"Bearer {TOKEN}", "content-length": str(len(body)), "idempotency-key": "run/0/traj-3"}

    async def one():
        async def stream():
            yield body

        return await handler.handle(headers, stream())

    async def many():
        return await asyncio.gather(*(one() for _ in range(6)))

    answers = asyncio.run(many())
    assert [status for status, _ in answers] == [200] * 6
    assert {a["reward"] for _, a in answers} == {4.0}
    assert sum(not a["replayed"] for _, a in answers) == 1 and CALLS["traj-3"] == 1


def test_refusals_are_json_and_not_retried():
    cfg = run_config(max_payload_mb=0.001)
    _, _, asgi = setup(cfg)

    async def post(headers, content):
        async with httpx.AsyncClient(transport=asgi) as http:
            return await http.post("http://reward.test/reward", headers=headers, content=content)

    payload = json.dumps(to_payload(make_traj(1), "count")).encode()
    auth = {"authorization": f"Bearer {TOKEN}"}
    no_auth = asyncio.run(post({}, payload))
    wrong = asyncio.run(post({"authorization": "Bearer nope"}, payload))
    big = asyncio.run(post(auth, b"{" + b" " * 5000 + b"}"))
    bad_json = asyncio.run(post(auth, b"not json"))
    bad_payload = asyncio.run(post(auth, b'{"v": 1}'))
    assert (no_auth.status_code, no_auth.json()["code"]) == (401, "unauthorized")
    assert wrong.status_code == 401
    assert (big.status_code, big.json()["code"]) == (413, "payload_too_large")
    assert (bad_json.status_code, bad_json.json()["code"]) == (400, "bad_request")
    assert bad_payload.status_code == 422 and "trajectory_id" in bad_payload.json()["error"]

    client = HttpRewardClient("http://reward.test/reward", run_config().reward, token="wrong", transport=asgi)
    res = asyncio.run(client.score(make_traj(1), "count"))
    assert not res.ok and res.attempts == 1 and "HTTP 401" in res.error


def test_failing_reward_ends_as_failed_result_after_retries():
    cfg = RunConfig(domains={"boom": DomainConfig(env="math", reward=f"{__name__}:boom_reward")})
    cfg.reward = RewardConfig(retries=2, backoff_s=0.001)
    _, _, asgi = setup(cfg)
    client = HttpRewardClient("http://reward.test/reward", cfg.reward, token=TOKEN, transport=asgi)
    traj = Trajectory("b1", Task("k", "boom", "math", 0, "g"), 0, (Turn((), (), (), (), action="a"),))
    res = asyncio.run(client.score(traj, "boom"))
    assert not res.ok and res.attempts == 3 and "HTTP 500" in res.error
    assert "ZeroDivisionError" in res.error and client.stats.failures == 1


def boom_reward(trajectory):
    return 1 / 0


@pytest.mark.parametrize("attempt, cap", [(1, 0.1), (2, 0.2), (3, 0.4), (10, 1.0)])
def test_backoff_is_full_jitter_capped(attempt, cap):
    rng = random.Random(0)
    delays = [backoff_delay(attempt, 0.1, 1.0, rng) for _ in range(200)]
    assert all(0 <= d <= cap for d in delays) and max(delays) > cap * 0.8
