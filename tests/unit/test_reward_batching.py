"""Batched reward requests: trajectories that end together go to the service in one HTTP request, the claim book
takes their claims in one call — and each one is still scored exactly once, answered as its own request
would be. The real handler behind an in-process ASGI app, reached by the real client (batched) through a
transport that injects HTTP 500s, dropped responses and timeouts."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rollart.reward.batching import RequestBatcher
from rollart.reward.claims import LocalClaimBook
from rollart.reward.client import HttpRewardClient
from rollart.reward.handler import ServiceFaults, claim_key
from rollart.reward.protocol import to_payload
from tests.unit.test_reward_exactly_once import CALLS, TOKEN, FaultyTransport, make_traj, run_config, setup


class Counting(httpx.AsyncBaseTransport):
    """Counts the HTTP requests and the trajectories they carried."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner, self.requests, self.items = inner, 0, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        body = json.loads(request.content)
        self.items += len(body["batch"]) if "batch" in body else 1
        return await self.inner.handle_async_request(request)


def test_every_trajectory_scored_exactly_once_in_batches_under_injected_faults():
    CALLS.clear()
    cfg = run_config(batch_ms=20.0, max_batch=16)
    claims, _, asgi = setup(cfg, ServiceFaults(error_prob=0.2, seed=1))
    counting = Counting(asgi)
    transport = FaultyTransport(counting, {"http500": 0.2, "drop": 0.2, "timeout": 0.15}, seed=3)
    client = HttpRewardClient("http://reward.test/reward", cfg.reward, token=TOKEN, transport=transport, seed=0,
                              batched=True)
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
    assert min(transport.injected.values()) > 0 and client.stats.retries > 0 and stats["replays"] > 0
    assert counting.items > counting.requests  # batched: fewer requests than the trajectories they carried
    assert client._batcher.batches < client._batcher.items


def test_a_batch_answers_each_item_as_its_own_request_would():
    """Scored, replayed, a key reused with another payload, a payload that is not valid — side by side."""
    CALLS.clear()
    cfg = run_config()
    claims, handler, _ = setup(cfg)
    texts = [json.dumps(to_payload(make_traj(i), "count")) for i in range(3)]

    async def post(items):
        body = json.dumps({"v": 1, "batch": items}).encode()

        async def stream():
            yield body

        return await handler.handle({"authorization": f"Bearer {TOKEN}", "content-length": str(len(body))}, stream())

    async def both():
        first = await post([{"idempotency_key": "run/0/a", "sent_at": None, "payload": texts[0]},
                            {"idempotency_key": None, "sent_at": 1.0, "payload": texts[1]}])
        second = await post([{"idempotency_key": "run/0/a", "payload": texts[0]},  # a retry: replayed
                             {"idempotency_key": "run/0/a", "payload": texts[2]},  # its key, another payload
                             {"payload": '{"v": 1}'}, {"payload": "not json"}])
        return first, second

    (s1, a1), (s2, a2) = asyncio.run(both())
    assert s1 == s2 == 200
    (r0, r1), (replay, conflict, invalid, not_json) = a1["results"], a2["results"]
    assert (r0["status"], r0["body"]["reward"], r0["body"]["replayed"]) == (200, 1.0, False)
    assert (r1["status"], r1["body"]["reward"], r1["body"]["cold_start"]) == (200, 2.0, True)  # sent before it began
    assert (replay["status"], replay["body"]["replayed"], replay["body"]["reward"]) == (200, True, 1.0)
    assert (conflict["status"], conflict["body"]["code"]) == (409, "conflict")
    assert invalid["status"] == 422 and "trajectory_id" in invalid["body"]["error"]
    assert (not_json["status"], not_json["body"]["field"]) == (400, "batch[3].payload")
    assert CALLS == {"traj-0": 1, "traj-1": 1} and claims.stats()["replays"] == 1


@pytest.mark.parametrize("envelope, field", [
    ({"v": 1, "batch": []}, "batch"), ({"v": True, "batch": [{"payload": "{}"}]}, "v"),
    ({"v": 1, "batch": [{"payload": {}}]}, "batch[0].payload"), ({"v": 1, "batch": [{"x": 1}]}, "batch[0]"),
    ({"v": 1, "batch": [{"payload": "{}", "idempotency_key": "a b"}]}, "batch[0].idempotency_key"),
    ({"v": 1, "batch": [{"payload": "{}"}], "extra": 1}, "body"),
])
def test_a_malformed_batch_is_refused_whole_naming_the_field(envelope, field):
    _, handler, _ = setup(run_config())
    body = json.dumps(envelope).encode()

    async def stream():
        yield body

    status, answer = asyncio.run(handler.handle({"authorization": f"Bearer {TOKEN}",
                                                 "content-length": str(len(body))}, stream()))
    assert (status, answer["field"]) == (422, field)


def test_a_refused_batch_fails_each_item_without_retries():
    cfg = run_config(batch_ms=5.0)
    _, _, asgi = setup(cfg)
    client = HttpRewardClient("http://reward.test/reward", cfg.reward, token="wrong", transport=asgi, batched=True)

    async def two():
        return await asyncio.gather(client.score(make_traj(1), "count"), client.score(make_traj(2), "count"))

    for res in asyncio.run(two()):
        assert not res.ok and res.attempts == 1 and "HTTP 401" in res.error


def test_claims_in_batches_follow_the_rules_item_by_item():
    one, many = LocalClaimBook(1 << 20, 60, 30), LocalClaimBook(1 << 20, 60, 30)
    items = [("k1", "d1"), ("k2", "d2"), ("k1", "d1"), ("k1", "other")]
    assert many.claim_many(items) == [one.claim(k, d) for k, d in items]
    answers = [("k1", 1, {"reward": 1.0}), ("k2", 2, {"reward": 0.0}), ("k2", 2, {"reward": 0.0})]
    assert many.complete_many(answers) == [one.complete(k, t, a) for k, t, a in answers]
    many.release_many([("k3", 9)])
    assert many.stats() == one.stats() and many.stats()["duplicates"] == 1


def test_the_batcher_cuts_by_count_and_by_bytes():
    sent: list[list[dict]] = []

    async def post(body: bytes) -> httpx.Response:
        items = json.loads(body)["batch"]
        sent.append(items)
        return httpx.Response(200, json={"results": [{"status": 200, "body": {"n": it["payload"]}} for it in items]})

    async def go(batcher, payloads):
        return await asyncio.gather(*(batcher.send(f"k{i}", 0.0, p) for i, p in enumerate(payloads)))

    by_count = asyncio.run(go(RequestBatcher(post, 50.0, 3, 1 << 20), [str(i) for i in range(7)]))
    assert [len(b) for b in sent] == [3, 3, 1] and [body["n"] for _, body in by_count] == [str(i) for i in range(7)]
    sent.clear()
    asyncio.run(go(RequestBatcher(post, 50.0, 64, 1200), ["x" * 400] * 4))
    assert [len(b) for b in sent] == [2, 2]  # two 400-byte payloads fit in 1,200 bytes with their keys, three do not
