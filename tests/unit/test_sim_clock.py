"""The twin's virtual-time event loop: time jumps to the next timer, thread work is waited for, a
deadlock raises instead of hanging."""

import asyncio
import time

import pytest

from rollart.sim.clock import SimulationDeadlock, run_virtual


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
