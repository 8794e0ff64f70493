"""The twin's virtual-time event loop: time jumps to the next timer, thread work is waited for, a
deadlock raises instead of hanging."""

import asyncio
import gc
import random
import sys
import time

import pytest

from rollart.sim import clock
from rollart.sim.clock import FAR_TIMER_S, SimulationDeadlock, run_virtual


def test_an_hour_of_sleeps_takes_no_real_time() -> None:
    async def main() -> tuple[float, list[int]]:
        order: list[int] = []

        async def sleeper(i: int) -> None:
            await asyncio.sleep(3600 - i)
            order.append(i)

        await asyncio.gather(*(sleeper(i) for i in range(3)))
        return asyncio.get_running_loop().time(), order

    started = time.perf_counter()
    now, order = run_virtual(main())
    assert now == pytest.approx(3600.0)
    assert order == [2, 1, 0]  # timers fire in virtual-time order
    assert time.perf_counter() - started < 5.0


def test_far_timers_fire_in_the_order_one_heap_would_fire_them() -> None:
    """Timers due beyond FAR_TIMER_S wait outside the loop's heap: the order is still (due time, order set),
    cancelled ones never fire, and timers set later (from callbacks, as the clock moves) join the same order."""
    rng = random.Random(7)
    fired: list[int] = []
    expected: list[tuple[float, int]] = []
    seq = iter(range(10**6))

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def fire(i: int) -> None:
            fired.append(i)
            if rng.random() < 0.3:  # a callback sets more, some far, some at an instant already set
                schedule(loop.time() + rng.choice([0.0, 1.0, FAR_TIMER_S, 4 * FAR_TIMER_S, 36000.0]))

        def schedule(when: float) -> None:
            i = next(seq)
            handle = loop.call_at(when, fire, i)
            if rng.random() < 0.4:
                handle.cancel()
            else:
                expected.append((when, i))

        for _ in range(3000):
            schedule(rng.choice([rng.uniform(0, 10), rng.uniform(0, 3 * FAR_TIMER_S), 3600.0, 36000.0]))
        await asyncio.sleep(40000)

    run_virtual(main())
    assert fired == [i for when, i in sorted(expected) if when < 40000]  # (the run ends at 40,000 s)


def test_the_loops_heap_holds_only_the_timers_due_soon() -> None:
    """A thousand waits with an hour's timeout, each ending within seconds: the heap every event goes
    through keeps the near timers only, and the far ones, cancelled, are dropped."""
    sizes: list[int] = []

    async def waiter(i: int) -> None:
        for turn in range(5):
            async with asyncio.timeout(3600):
                await asyncio.sleep(1 + (i + turn) % 7)
            sizes.append(len(asyncio.get_running_loop()._scheduled))  # type: ignore[attr-defined]

    async def main() -> int:
        await asyncio.gather(*(waiter(i) for i in range(1000)))
        return len(asyncio.get_running_loop()._far)  # type: ignore[attr-defined]

    far_left = run_virtual(main())
    assert max(sizes) <= 1000 and far_left <= 1000


def test_with_only_far_timers_the_clock_jumps_to_the_earliest() -> None:
    order: list[float] = []

    async def main() -> float:
        loop = asyncio.get_running_loop()
        for when in (7200.0, 3600.0, 3600.0 + FAR_TIMER_S / 3, 36000.0):
            loop.call_at(when, order.append, when)
        await asyncio.sleep(40000)
        return loop.time()

    assert run_virtual(main()) == pytest.approx(40000)
    assert order == [3600.0, 3600.0 + FAR_TIMER_S / 3, 7200.0, 36000.0]


def test_wait_for_times_out_in_virtual_time() -> None:
    async def main() -> float:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), 5)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == pytest.approx(5.0)


def test_thread_work_is_waited_for_and_costs_no_virtual_time() -> None:
    async def main() -> tuple[int, float]:
        value = await asyncio.to_thread(lambda: (time.sleep(0.05), 7)[1])
        return value, asyncio.get_running_loop().time()

    assert run_virtual(main()) == (7, 0.0)


def test_a_wait_that_can_never_end_is_a_deadlock() -> None:
    async def main() -> None:
        await asyncio.sleep(2)
        await asyncio.Event().wait()

    with pytest.raises(SimulationDeadlock, match="virtual time 2.000"):
        run_virtual(main())


def test_work_that_never_lets_time_move_is_a_livelock() -> None:
    async def main() -> None:
        while True:
            await asyncio.sleep(0)

    with pytest.raises(SimulationDeadlock, match="livelock"):
        run_virtual(main())


def test_the_young_generation_is_collected_once_the_heap_has_doubled(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a simulation runs, the next young collection waits for as many new objects as memory blocks
    alive (at least GC_YOUNG_THRESHOLD); the collector's own thresholds come back after it."""
    monkeypatch.setattr(clock, "GC_YOUNG_THRESHOLD", 1000)  # (below this process's heap: the heap decides)
    before = gc.get_threshold()

    async def main() -> tuple[int, int]:
        gc.collect(0)
        return gc.get_threshold()[0], sys.getallocatedblocks()

    young, blocks = run_virtual(main())
    assert abs(young - blocks) < blocks // 10
    assert gc.get_threshold() == before
