"""LLMProxy when workers die and join (fake in-process worker handles raising Ray's own death errors):
the turn is generated again on another worker of the pool — same request, so the same prompt ids and seed —
or on the pool's fallback; with no worker left a request waits for one to join; a joining worker serves the
current version before it takes a request; a weight update goes on past a dead worker. Every test runs twice:
workers taking one call per request, and workers offering the batched form (`submit`/`take`, as an
InferenceWorker does), whose pending `take` raises the death error when the worker dies."""

from __future__ import annotations

import asyncio

import pytest
import ray.exceptions

from rollart.base.batched_calls import Outbox
from rollart.config import InferenceConfig
from rollart.inference.proxy import LLMProxy
from rollart.types import GenerationRequest, GenerationResult, SamplingParams


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class FakeWorker:
    """Answers like an InferenceWorker; `die()` makes every later (and the pending) call raise. With `BATCHED`
    (the `batched` fixture) it also offers `submit`/`take`, which the proxy then uses for `generate`."""

    BATCHED = False

    def __init__(self, name: str, gate: asyncio.Event | None = None) -> None:
        self.name, self.gate = name, gate
        self.dead = False
        self.died = asyncio.Event()
        self.version = 0
        self.requests: list[GenerationRequest] = []
        self.outbox = Outbox()
        methods = ("generate", "update_weights", "ready", "abort", "stats") + (("submit", "take") if self.BATCHED else ())
        for method in methods:
            setattr(self, method, _Method(getattr(self, f"_{method}")))

    def die(self) -> None:
        self.dead = True
        self.died.set()
        if self.gate:
            self.gate.set()

    async def _submit(self, channel, items):
        self._check()
        self.outbox.start(channel, [(seq, self._generate(request)) for seq, request in items])

    async def _take(self, channel):
        self._check()
        taking, dying = asyncio.ensure_future(self.outbox.take(channel, 5.0)), asyncio.ensure_future(self.died.wait())
        await asyncio.wait({taking, dying}, return_when=asyncio.FIRST_COMPLETED)
        dying.cancel()
        if self.dead:  # as Ray raises for a call the actor's death ended
            taking.cancel()
            self._check()
        return taking.result()

    def _check(self) -> None:
        if self.dead:
            raise ray.exceptions.ActorDiedError()

    async def _generate(self, request):
        self._check()
        self.requests.append(request)
        if self.gate:
            await self.gate.wait()
        self._check()
        return GenerationResult(request.request_id, request.trajectory_id, (1,), (-0.5,), (self.version,), "stop",
                                worker=self.name)

    async def _update_weights(self, version):
        self._check()
        self.version = version
        return {"version": float(version)}

    async def _ready(self):
        self._check()
        return self.name

    async def _abort(self, trajectory_id):
        self._check()

    async def _stats(self):
        return {}


@pytest.fixture(autouse=True, params=["per_call", "batched"])
def batched(request, monkeypatch):
    monkeypatch.setattr(FakeWorker, "BATCHED", request.param == "batched")
    return request.param


def request(traj: str, domain: str = "math") -> GenerationRequest:
    return GenerationRequest(f"{traj}/0", traj, domain, (3, 4, 5), SamplingParams(max_new_tokens=4, seed=11))


def proxy(workers, **cfg) -> LLMProxy:
    return LLMProxy(workers, {"math": "decode"}, InferenceConfig(**{"admission_timeout_s": 5, **cfg}),
                    pool_fallbacks={"decode": ["prefill"]})


def test_a_turn_whose_worker_dies_is_generated_again_on_another_worker_of_the_pool():
    async def main():
        a, b = FakeWorker("a", gate=asyncio.Event()), FakeWorker("b")
        p = proxy({"decode": [a, b], "prefill": [FakeWorker("c")]})
        pending = asyncio.ensure_future(p.generate(request("t1")))
        await asyncio.sleep(0.05)
        a.die()  # t1 went to a (index 0, idle pool): its call fails with ActorDiedError
        result = await pending
        assert result.worker == "b" and b.requests == a.requests  # the same request: prompt ids and seed
        assert (await p.generate(request("t2"))).worker == "b"  # a is out of the routing
        stats = await p.stats()
        assert stats["turn_retries"] == 1 and stats["workers_lost"] == 1

    asyncio.run(main())


def test_a_pool_with_no_worker_left_falls_back_then_a_joining_worker_takes_over_at_the_served_version():
    async def main():
        a, c = FakeWorker("a"), FakeWorker("c")
        p = proxy({"decode": [a], "prefill": [c]})
        await p.update_weights(4)
        a.die()
        assert (await p.generate(request("t1"))).worker == "c"  # the fallback pool
        replacement = FakeWorker("a2")
        assert await p.add_worker("decode", replacement) == "a2"
        assert replacement.version == 4  # pulled before taking traffic
        assert (await p.generate(request("t1"))).worker == "a2"  # back on its own pool

    asyncio.run(main())


def test_with_no_worker_anywhere_a_request_waits_for_one_to_join_and_updates_skip_the_dead():
    async def main():
        a, c = FakeWorker("a"), FakeWorker("c")
        p = proxy({"decode": [a], "prefill": [c]})
        a.die()
        c.die()
        updated = await p.update_weights(2)  # both dead: no error, nobody updated
        assert updated == {} and (await p.stats())["workers_lost"] == 2
        pending = asyncio.ensure_future(p.generate(request("t1")))
        await asyncio.sleep(0.1)
        assert not pending.done() and (await p.stats())["waiting_admission"] == 1
        joined = FakeWorker("c2")
        await p.add_worker("prefill", joined)
        assert (await asyncio.wait_for(pending, 5)).worker == "c2" and joined.version == 2

    asyncio.run(main())


def test_the_retries_are_bounded_and_a_lost_wait_says_what_it_waited_for():
    async def main():
        workers = [FakeWorker(n) for n in "abc"]
        for w in workers:
            w.die()
        p = proxy({"decode": workers[:2], "prefill": workers[2:]}, turn_retries=1)
        with pytest.raises(RuntimeError, match=r"lost its worker 2 times \(inference.turn_retries=1\)"):
            await p.generate(request("t1"))
        p = proxy({"decode": [FakeWorker("x")], "prefill": [FakeWorker("y")]}, admission_timeout_s=0.2)
        await p.remove_worker(str(id(p._workers["decode"][0])), "test")
        await p.remove_worker(str(id(p._workers["prefill"][0])), "test")
        with pytest.raises(TimeoutError, match="no inference worker for domain 'math'.*joined within 0.2 s"):
            await p.generate(request("t2"))

    asyncio.run(main())


def test_a_worker_that_never_answers_fails_its_turns_at_the_call_bound_and_the_others_go_on(monkeypatch):
    monkeypatch.setattr("rollart.inference.proxy._WORKER_CALL_MARGIN_S", 0.0)

    async def main():
        hung, fine = FakeWorker("hung", gate=asyncio.Event()), FakeWorker("fine")
        p = proxy({"decode": [hung], "prefill": [fine]}, request_timeout_s=0.3)
        started = asyncio.get_running_loop().time()
        turns = [asyncio.ensure_future(p.generate(request(f"t{i}"))) for i in range(3)]
        await asyncio.sleep(0.1)
        p._router.remove(("decode", 0))  # later turns go to the fallback pool, which answers
        assert (await p.generate(request("t9"))).worker == "fine"
        for turn in turns:
            with pytest.raises(TimeoutError, match=r"worker .* gave no answer for request 't\d/0' within 0.3 s"):
                await asyncio.wait_for(turn, 5)
        assert 0.3 <= asyncio.get_running_loop().time() - started < 1.5
        assert not p._call_deadlines._waits  # every bounded call ended

    asyncio.run(main())
