"""The LLM proxy's lendable pool (`train.elastic_generation`): routed to only while lent, a turn taken back goes on
elsewhere from its tokens (one result, versions in order), a user's abort is not continued, `rebalance` levels
the load onto the lent workers, weight updates skip them. Workers here decode one token per 0.1 s of virtual
time and answer an abort with the tokens so far — the worker protocol's semantics. Every test runs twice: workers
taking one call per request, and workers offering the batched form (`submit`/`take`, as an InferenceWorker does)."""

import asyncio

import pytest

from rollart.base.batched_calls import Outbox
from rollart.config import InferenceConfig
from rollart.inference.proxy import LLMProxy
from rollart.sim.clock import run_virtual
from rollart.sim.engine import LocalHandle
from rollart.types import GenerationRequest, GenerationResult, SamplingParams


class TokenWorker:
    def __init__(self, name: str, version: int) -> None:
        self.name, self.version = name, version
        self.aborted: set[str] = set()
        self.updates: list[int] = []
        self.prompts: dict[str, int] = {}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.prompts[request.trajectory_id] = len(request.prompt_token_ids)
        tokens: list[int] = []
        while len(tokens) < request.sampling.max_new_tokens:
            await asyncio.sleep(0.1)
            if request.trajectory_id in self.aborted:
                self.aborted.discard(request.trajectory_id)
                return self._result(request, tokens, "abort")
            tokens.append(7)
        return self._result(request, tokens, "stop")

    def _result(self, request: GenerationRequest, tokens: list[int], reason: str) -> GenerationResult:
        n = len(tokens)
        return GenerationResult(request.request_id, request.trajectory_id, tuple(tokens), (0.0,) * n,
                                (self.version,) * n, reason, len(request.prompt_token_ids), worker=self.name)

    async def abort(self, trajectory_id: str) -> None:
        self.aborted.add(trajectory_id)

    preempt = abort  # (this fake forgets an abort once it has ended the turn, so the two are one)

    async def update_weights(self, version: int) -> dict:
        self.updates.append(version)
        return {}

    async def ready(self) -> str:
        return self.name


class BatchedTokenWorker(TokenWorker):
    """The same worker, also offering the batched form of `generate` the proxy prefers."""

    def __init__(self, name: str, version: int) -> None:
        super().__init__(name, version)
        self.outbox = Outbox()

    async def submit(self, channel: str, items: list) -> None:
        self.outbox.start(channel, [(seq, self.generate(request)) for seq, request in items])

    async def take(self, channel: str) -> list:
        return await self.outbox.take(channel, 30.0)


WORKER = TokenWorker  # (the `worker_kind` fixture switches it)


@pytest.fixture(autouse=True, params=["per_call", "batched"])
def worker_kind(request, monkeypatch):
    monkeypatch.setitem(globals(), "WORKER", BatchedTokenWorker if request.param == "batched" else TokenWorker)
    return request.param


def proxy_with(own: int = 1, lent: int = 1) -> tuple[LLMProxy, list[TokenWorker], list[TokenWorker]]:
    mine = [WORKER(f"gen{i}", 1) for i in range(own)]
    theirs = [WORKER(f"lent{i}", 2) for i in range(lent)]
    proxy = LLMProxy({"gen": [LocalHandle(w) for w in mine], "trainer": [LocalHandle(w) for w in theirs]},
                     {"math": "gen"}, InferenceConfig(), lendable=["trainer"])
    return proxy, mine, theirs


def request(trajectory_id: str, tokens: int = 10) -> GenerationRequest:
    return GenerationRequest(f"{trajectory_id}/0", trajectory_id, "math", (1, 2, 3), SamplingParams(max_new_tokens=tokens))


def test_a_lendable_pool_takes_nothing_until_lent_then_a_taken_back_turn_goes_on_elsewhere() -> None:
    proxy, mine, theirs = proxy_with()

    async def main() -> tuple:
        first = await proxy.generate(request("t0", 3))  # not lent: its own pool
        busy = asyncio.ensure_future(proxy.generate(request("t1", 50)))  # its own pool's one worker is busy now
        await asyncio.sleep(0.05)
        await proxy.lend("trainer")
        moved = asyncio.ensure_future(proxy.generate(request("t2", 10)))  # the lent worker is less loaded
        await asyncio.sleep(0.45)  # 4 tokens on the lent worker
        taken_back = await proxy.reclaim("trainer")
        return first, await moved, await busy, taken_back, await proxy.stats()

    first, moved, busy, taken_back, stats = run_virtual(main())
    assert first.worker == "gen0" and busy.worker == "gen0"
    assert taken_back == 1 and stats["preempted_turns"] == 1 and stats["preempted_tokens"] == 4
    # one result for the turn: 4 tokens at the trainer's version, then 6 more on its own pool, in order
    assert moved.token_ids == (7,) * 10 and moved.finish_reason == "stop" and moved.request_id == "t2/0"
    assert moved.versions == (2,) * 4 + (1,) * 6 and len(moved.logprobs) == 10
    assert moved.worker == "gen0" and mine[0].prompts["t2"] == 3 + 4  # the context plus the tokens so far
    assert stats["routed_by_domain"]["math"] == {"gen": 3, "trainer": 1}  # t0, t1, the rest of t2


def test_a_users_abort_on_a_lent_worker_is_not_continued() -> None:
    proxy, _, theirs = proxy_with(own=1, lent=1)

    async def main() -> GenerationResult:
        await proxy.lend("trainer")
        blocker = asyncio.ensure_future(proxy.generate(request("t0", 30)))
        await asyncio.sleep(0.01)
        turn = asyncio.ensure_future(proxy.generate(request("t1", 30)))
        await asyncio.sleep(0.35)
        await proxy.abort("t1")
        result = await turn
        blocker.cancel()
        return result

    result = run_virtual(main())
    assert result.finish_reason == "abort" and len(result.token_ids) == 3


def test_rebalance_levels_the_requests_onto_the_lent_workers_and_updates_skip_them() -> None:
    proxy, mine, theirs = proxy_with(own=1, lent=2)

    async def main() -> tuple:
        turns = [asyncio.ensure_future(proxy.generate(request(f"t{i}", 20))) for i in range(6)]
        await asyncio.sleep(0.25)
        await proxy.lend("trainer")
        moved = await proxy.rebalance("trainer")
        await asyncio.sleep(0.15)  # (a worker takes an abort between two of its tokens)
        in_flight = await proxy.in_flight()
        await proxy.update_weights(5)
        results = await asyncio.gather(*turns)
        return moved, in_flight, results

    moved, in_flight, results = run_virtual(main())
    assert moved == 4 and sorted(in_flight.values()) == [2, 2, 2]  # 6 turns over 3 workers
    assert all(r.token_ids == (7,) * 20 and r.finish_reason == "stop" for r in results)
    assert mine[0].updates == [5] and theirs[0].updates == theirs[1].updates == []


def test_lend_refuses_a_pool_that_is_not_lendable() -> None:
    proxy, _, _ = proxy_with()
    with pytest.raises(ValueError, match="not lendable"):
        asyncio.run(proxy.lend("gen"))
