"""`Deadlines` behaves as `asyncio.timeout` (the oracle) for waits of one length, with one timer between them."""

from __future__ import annotations

import asyncio

import pytest

from rollart.base.deadlines import Deadlines

SECONDS = 0.2


async def _outcome(bound, sleep_s: float) -> str:
    try:
        async with bound:
            await asyncio.sleep(sleep_s)
    except TimeoutError as exc:
        assert isinstance(exc.__cause__, asyncio.CancelledError)
        return "timeout"
    return "done"


@pytest.mark.parametrize("sleeps", [(0.05, 0.5, 0.1, 0.35, 0.01), (0.5, 0.5), (0.0, 0.1)])
def test_each_wait_ends_or_times_out_as_under_asyncio_timeout(sleeps):
    async def run(make):
        return await asyncio.gather(*(_outcome(make(), s) for s in sleeps))

    deadlines = Deadlines(SECONDS)
    ours = asyncio.run(run(deadlines.bound))
    oracle = asyncio.run(run(lambda: asyncio.timeout(SECONDS)))
    assert ours == oracle == ["done" if s < SECONDS else "timeout" for s in sleeps]
    assert not deadlines._waits, "no ended wait is held"


def test_waits_begun_later_time_out_later_and_one_timer_serves_them_all():
    async def main():
        loop = asyncio.get_running_loop()
        deadlines, timers = Deadlines(SECONDS), []
        call_at = loop.call_at

        def counted(*args, **kwargs):
            if getattr(args[1], "__func__", None) is Deadlines._fire:
                timers.append(args[0])
            return call_at(*args, **kwargs)

        loop.call_at = counted  # type: ignore[method-assign]
        started = loop.time()

        async def staggered(delay: float) -> float:
            await asyncio.sleep(delay)
            assert await _outcome(deadlines.bound(), 10.0) == "timeout"
            return loop.time() - started

        ended = await asyncio.gather(*(staggered(i * 0.05) for i in range(20)))
        for i, at in enumerate(ended):
            assert i * 0.05 + SECONDS <= at + 1e-3 < i * 0.05 + SECONDS + 0.15
        assert len(timers) <= 21  # one timer at a time: armed once, then once per firing at most
        assert not deadlines._waits and deadlines._timer is None

    asyncio.run(main())


def test_a_cancel_from_outside_passes_through_and_ends_the_wait():
    async def main():
        deadlines = Deadlines(SECONDS)

        async def waiter():
            async with deadlines.bound():
                await asyncio.sleep(10)

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not deadlines._waits
        assert await _outcome(deadlines.bound(), 0.01) == "done"  # the next wait is bounded afresh

    asyncio.run(main())


def test_an_outer_timeout_still_wins_over_a_longer_inner_bound():
    async def main():
        deadlines = Deadlines(5.0)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                async with deadlines.bound():
                    await asyncio.sleep(10)
        assert not deadlines._waits

    asyncio.run(main())


def test_a_new_event_loop_starts_with_no_timer_of_the_last_one():
    deadlines = Deadlines(SECONDS)

    async def abandon():  # the loop ends with a wait running and the timer set
        asyncio.create_task(_outcome(deadlines.bound(), 10.0))
        await asyncio.sleep(0)

    asyncio.run(abandon())
    assert asyncio.run(_outcome(deadlines.bound(), 10.0)) == "timeout"


def test_seconds_must_be_positive():
    with pytest.raises(ValueError, match="seconds must be > 0"):
        Deadlines(0)
