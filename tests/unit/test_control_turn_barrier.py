"""The turn barrier (`rollart/control/turn_barrier.py`): lock step per cohort, late joiners and leavers, a waiter
that gives up alone, and a paper-scale cohort (5,120 trajectories, the 1,000-GPU preset's batch) in linear time."""

from __future__ import annotations

import asyncio

import pytest

from rollart.control.turn_barrier import LocalTurnBarrier
from rollart.sim.clock import run_virtual


def test_a_member_that_leaves_releases_the_others_and_one_that_joins_late_holds_them():
    async def scenario() -> list[str]:
        barrier, order = LocalTurnBarrier(timeout_s=5), []
        for tid in ("a", "b"):
            await barrier.join(tid, cohort=0)
        await asyncio.gather(barrier.before_turn("a", 0), barrier.before_turn("b", 0))

        async def wait(tid: str, turn: int) -> None:
            await barrier.before_turn(tid, turn)
            order.append(f"{tid}@{turn}")

        a = asyncio.create_task(wait("a", 1))
        await asyncio.sleep(0.01)
        await barrier.join("c", cohort=0)  # joins while a waits at turn 1: a now waits for c too
        await barrier.leave("b")
        await asyncio.sleep(0.01)
        order.append("b left")
        await barrier.before_turn("c", 0)
        await asyncio.sleep(0.01)
        order.append("c at 0")
        await wait("c", 1)
        await a
        return order

    assert asyncio.run(scenario()) == ["b left", "c at 0", "c@1", "a@1"]


def test_a_wait_cancelled_ends_alone_and_the_others_still_pass():
    async def scenario() -> None:
        barrier = LocalTurnBarrier(timeout_s=5)
        for tid in ("a", "b", "slow"):
            await barrier.join(tid, cohort=7)
        a = asyncio.create_task(barrier.before_turn("a", 0))
        b = asyncio.create_task(barrier.before_turn("b", 0))  # waits on the gate a waits on
        await asyncio.sleep(0.01)
        b.cancel()  # what a timeout does to b's wait
        await asyncio.sleep(0.01)
        assert b.cancelled() and not a.done()
        await barrier.before_turn("slow", 0)  # the gate opens for a: b's cancellation did not cancel a's wait
        await asyncio.wait_for(a, 1)

    asyncio.run(scenario())


def test_a_timed_out_wait_names_the_late_trajectories():
    async def scenario() -> None:
        barrier = LocalTurnBarrier(timeout_s=0.05)
        for tid in ("a", "slow"):
            await barrier.join(tid, cohort=7)
        await barrier.before_turn("a", 0)

    with pytest.raises(TimeoutError, match=r"a waited 0s at turn 0 for 1 trajectories of cohort 7 \(\['slow'\]"):
        asyncio.run(scenario())


def test_a_paper_scale_cohort_advances_ten_turns_in_lock_step():
    members, turns = 5_120, 10  # the 1,000-GPU preset's batch; re-checking every member per arrival is cubic

    async def scenario() -> list[int]:
        barrier, passed = LocalTurnBarrier(timeout_s=600), []
        for i in range(members):
            await barrier.join(f"t{i}", cohort=0)

        async def member(i: int) -> None:
            for k in range(turns):
                await barrier.before_turn(f"t{i}", k)
                passed.append(k)
                await asyncio.sleep((i * 7919 + k) % 13)  # uneven environment times, in virtual seconds
            await barrier.leave(f"t{i}")

        await asyncio.gather(*(member(i) for i in range(members)))
        return passed

    passed = run_virtual(scenario())
    assert len(passed) == members * turns
    assert passed == sorted(passed), "a trajectory began a turn before its cohort had all reached it"
