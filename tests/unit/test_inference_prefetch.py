"""WeightPrefetcher: background pull of the newest version on the worker's event loop, no double pull,
exposed vs background time, and the loop never blocked by a pull."""

from __future__ import annotations

import asyncio
import threading
import time

from rollart.inference.prefetch import WeightPrefetcher


class SlowSubscriber:
    """A `WeightSubscriber` whose pulls take `delay_s` (awaited, as the store's are)."""

    def __init__(self, latest: int, delay_s: float = 0.0, fail_first: bool = False) -> None:
        self.latest = latest
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.pulls: list[int] = []
        self.pulling = asyncio.Event()

    async def latest_version(self) -> int:
        return self.latest

    async def pull(self, version: int) -> dict[str, int]:
        self.pulls.append(version)
        self.pulling.set()
        if self.fail_first:
            self.fail_first = False
            raise ConnectionError("store unreachable")
        await asyncio.sleep(self.delay_s)
        return {"w": version}


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_prefetched_version_is_taken_without_an_exposed_pull():
    async def run() -> None:
        sub = SlowSubscriber(latest=3)
        pre = WeightPrefetcher(sub, inference_version=0, poll_s=0.01)
        pre.start()
        try:
            await until(lambda: pre.stats()["prefetched_version"] == 3)
            assert await pre.take(3) == {"w": 3}
            s = pre.stats()
            assert sub.pulls == [3] and s["pulls_background"] == 1 and s["pulls_exposed"] == 0
            assert s["prefetched_version"] == -1
            await asyncio.sleep(0.05)
            assert sub.pulls == [3]  # nothing newer than what is served: no further pull
        finally:
            pre.close()

    asyncio.run(run())


def test_take_waits_for_the_pull_in_progress_instead_of_pulling_twice():
    async def run() -> None:
        sub = SlowSubscriber(latest=1, delay_s=0.3)
        pre = WeightPrefetcher(sub, inference_version=0, poll_s=0.01)
        pre.start()
        try:
            await asyncio.wait_for(sub.pulling.wait(), 5)
            assert await pre.take(1) == {"w": 1}
            assert sub.pulls == [1] and pre.stats()["pulls_exposed"] == 0
            assert pre.stats()["pull_s_exposed"] > 0  # the wait for the unfinished pull was exposed time
            await asyncio.sleep(0.05)
            assert sub.pulls == [1] and pre.stats()["prefetched_version"] == -1  # served: not held again
        finally:
            pre.close()

    asyncio.run(run())


def test_version_not_prefetched_is_pulled_on_demand_and_errors_are_retried():
    async def run() -> None:
        sub = SlowSubscriber(latest=0, fail_first=True)
        pre = WeightPrefetcher(sub, inference_version=0, poll_s=0.01)
        pre.start()
        try:
            sub.latest = 2
            await until(lambda: pre.stats()["prefetched_version"] == 2)  # the first pull failed, the next worked
            assert "ConnectionError: store unreachable" in pre.last_error
            assert await pre.take(4) == {"w": 4} and pre.stats()["pulls_exposed"] == 1
        finally:
            pre.close()

    asyncio.run(run())


def test_a_background_pull_leaves_the_event_loop_free():
    """While a slow pull is in progress, other coroutines on the loop (the worker's requests) keep running."""

    async def run() -> None:
        sub = SlowSubscriber(latest=1, delay_s=0.5)
        pre = WeightPrefetcher(sub, inference_version=0, poll_s=0.01)
        pre.start()
        try:
            await asyncio.wait_for(sub.pulling.wait(), 5)
            ticks, start = 0, time.monotonic()
            while time.monotonic() - start < 0.3:
                await asyncio.sleep(0.01)
                ticks += 1
            assert ticks >= 10 and pre.stats()["prefetched_version"] == -1  # ran while the pull was going on
        finally:
            pre.close()

    asyncio.run(run())


def test_close_stops_the_polling_task():
    async def run() -> None:
        pre = WeightPrefetcher(SlowSubscriber(latest=0), inference_version=0, poll_s=0.01)
        pre.start()
        task = pre._task
        pre.close()
        await asyncio.sleep(0.02)
        assert task is not None and task.cancelled()

    asyncio.run(run())


def test_pulled_weights_are_prepared_on_a_thread_and_a_take_gets_them_prepared():
    """The engine's prepare (a LoRA merge) runs on a thread after the pull: the loop stays free, and a take
    that arrives while it runs waits for the prepared tensors (no second merge at the swap)."""

    async def run() -> None:
        started, finished = asyncio.Event(), threading.Event()
        loop = asyncio.get_running_loop()

        def prepare(tensors: dict[str, int]) -> dict[str, int]:
            loop.call_soon_threadsafe(started.set)
            time.sleep(0.3)  # blocking work, as a merge is
            finished.set()
            return {**tensors, "merged": 1}

        sub = SlowSubscriber(latest=1)
        pre = WeightPrefetcher(sub, inference_version=0, poll_s=0.01, prepare=prepare)
        pre.start()
        try:
            await asyncio.wait_for(started.wait(), 5)
            ticks = 0
            while not finished.is_set():
                await asyncio.sleep(0.01)
                ticks += not finished.is_set()
            assert ticks >= 2  # the loop ran while prepare blocked its thread (on the loop's: 0)
            assert await pre.take(1) == {"w": 1, "merged": 1}
            s = pre.stats()
            assert sub.pulls == [1] and s["pulls_exposed"] == 0 and s["prepare_s_background"] >= 0.25
            pre.close()  # no more background pulls: a version taken now is pulled on demand, unprepared
            assert await pre.take(2) == {"w": 2}  # (the engine merges it at the swap)
        finally:
            pre.close()

    asyncio.run(run())
