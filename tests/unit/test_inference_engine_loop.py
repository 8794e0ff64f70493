"""EngineLoop without Ray: results reach callers per request, aborts (also ahead of the ADD), failures."""

from __future__ import annotations

import asyncio
import time

import pytest

from rollart.inference.engine_loop import EngineLoop
from rollart.types import GenerationRequest, GenerationResult


class CountingEngine:
    """Finishes a request after `max_new_tokens` steps; one token per step. Single-threaded like a real one."""

    def __init__(self, fail_at_step: int | None = None) -> None:
        self.running: dict[str, list] = {}
        self.aborts: list[str] = []
        self.steps = 0
        self.fail_at_step = fail_at_step
        self.version = 0

    def add(self, request):
        if request.sampling.max_new_tokens > 1000:
            raise ValueError("sampling.max_new_tokens=… is invalid")
        self.running[request.request_id] = [request, 0]

    def abort(self, request_id):
        if request_id in self.running:
            self.aborts.append(request_id)

    def has_work(self):
        return bool(self.running)

    def step(self):
        time.sleep(0.002)  # a step takes time, as a forward pass does
        self.steps += 1
        if self.fail_at_step == self.steps:
            raise RuntimeError("device lost")
        done = []
        for rid in list(self.running):
            req, n = self.running[rid]
            aborted = rid in self.aborts
            if not aborted:
                self.running[rid][1] = n = n + 1
            if aborted or n >= req.sampling.max_new_tokens:
                del self.running[rid]
                done.append(GenerationResult(rid, req.trajectory_id, (7,) * n, (0.0,) * n, (0,) * n,
                                             "abort" if aborted else "length"))
        self.aborts.clear()
        return done


def req(rid, traj, n):
    from rollart.types import SamplingParams

    return GenerationRequest(rid, traj, "d", (1, 2), SamplingParams(max_new_tokens=n))


def test_short_request_returns_before_a_long_batch_mate():
    async def main():
        loop = EngineLoop(CountingEngine(), "w")
        try:
            long = asyncio.ensure_future(loop.generate(req("long", "a", 10**3), timeout_s=30))
            short = await loop.generate(req("short", "b", 3), timeout_s=30)
            assert short.finish_reason == "length" and not long.done()
            loop.abort_trajectory("a")
            aborted = await long
            assert aborted.finish_reason == "abort" and 0 < len(aborted.token_ids) < 1000
            # a request of the aborted trajectory arriving later does not run
            late = await loop.generate(req("late", "a", 3), timeout_s=30)
            assert late.finish_reason == "abort" and late.token_ids == ()
            assert loop.in_flight == 0
        finally:
            loop.close()

    asyncio.run(main())


def test_a_preempted_trajectory_ends_its_turn_here_but_its_later_turns_still_run():
    """What the LLM proxy's moves need (a turn taken back from a lent engine may later be routed back to it)."""
    async def main():
        loop = EngineLoop(CountingEngine(), "w")
        try:
            running = asyncio.ensure_future(loop.generate(req("r1", "a", 10**3), timeout_s=30))
            other = asyncio.ensure_future(loop.generate(req("r2", "b", 10**3), timeout_s=30))
            await asyncio.sleep(0.02)
            loop.preempt_trajectory("a")
            first = await running
            assert first.finish_reason == "abort" and 0 < len(first.token_ids) < 1000 and not other.done()
            later = await loop.generate(req("r3", "a", 3), timeout_s=30)
            assert later.finish_reason == "length" and len(later.token_ids) == 3
            assert loop.preempt_all() == 1
            assert (await other).finish_reason == "abort"
            assert loop.in_flight == 0
        finally:
            loop.close()

    asyncio.run(main())


def test_bad_request_fails_only_its_caller_and_timeouts_abort():
    async def main():
        engine = CountingEngine()
        loop = EngineLoop(engine, "w")
        try:
            with pytest.raises(ValueError, match="max_new_tokens"):
                await loop.generate(req("bad", "a", 10**6), timeout_s=30)
            with pytest.raises(TimeoutError, match="did not finish within 0.05 s.*aborted"):
                await loop.generate(req("slow", "b", 10**3 - 1), timeout_s=0.05)
            assert (await loop.generate(req("ok", "c", 2), timeout_s=30)).finish_reason == "length"
            assert "slow" not in engine.running  # the timed-out request was aborted in the engine
            assert await loop.call(lambda e: e.version) == 0
        finally:
            loop.close()

    asyncio.run(main())


def test_failed_step_reaches_every_caller_and_the_loop_stops_serving():
    async def main():
        loop = EngineLoop(CountingEngine(fail_at_step=3), "w")
        try:
            calls = [loop.generate(req(f"r{i}", f"t{i}", 50), timeout_s=30) for i in range(2)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(r, RuntimeError) and "device lost" in str(r) for r in results)
            with pytest.raises(RuntimeError, match="serves no more"):
                await loop.generate(req("after", "x", 1), timeout_s=30)
        finally:
            loop.close()

    asyncio.run(main())


def test_the_requests_one_step_finishes_reach_their_own_callers_on_each_callers_loop():
    """Results a step finishes together go to each caller's loop with one wake-up; each caller gets its own, and a
    caller on another event loop (another thread) gets its own too."""
    import threading

    loop_ = EngineLoop(CountingEngine(), "w")
    other: dict[str, GenerationResult] = {}

    def other_thread() -> None:
        async def one():
            other["x"] = await loop_.generate(req("x/0", "x", 3), 5)

        asyncio.run(one())

    async def main():
        thread = threading.Thread(target=other_thread)
        thread.start()
        results = await asyncio.gather(*(loop_.generate(req(f"{t}/0", t, 3), 5) for t in "abc"))
        await asyncio.to_thread(thread.join, 5)
        return results

    try:
        results = asyncio.run(main())
        assert [r.request_id for r in results] == ["a/0", "b/0", "c/0"]
        assert other["x"].request_id == "x/0" and len(other["x"].token_ids) == 3
    finally:
        loop_.close()
