"""`rollart.base.batched_calls`: concurrent calls go as few messages, each answered on its own as soon as its
outcome exists (never held for batch-mates); a callee's death fails every waiting call with its error; a caller
that stops waiting leaves nothing behind. The callee here is an `Outbox` reached through plain coroutines."""

from __future__ import annotations

import asyncio

import pytest

from rollart.base.batched_calls import CallBatcher, Outbox


class Callee:
    """An actor-like callee: items are (name, gate); each call's value is its name once its gate opens."""

    def __init__(self) -> None:
        self.outbox = Outbox()
        self.submits: list[list[int]] = []
        self.takes = 0
        self.dead: BaseException | None = None

    async def _work(self, name: str, gate: asyncio.Event) -> str:
        await gate.wait()
        if name.startswith("bad"):
            raise ValueError(f"{name} is bad")
        return name

    async def submit(self, items):
        if self.dead is not None:
            raise self.dead
        self.submits.append([seq for seq, _ in items])
        self.outbox.start("c", [(seq, self._work(*item)) for seq, item in items])

    async def take(self):
        self.takes += 1
        if self.dead is not None:
            raise self.dead
        outcomes = await self.outbox.take("c", 5.0)
        if self.dead is not None:
            raise self.dead
        return outcomes


def batcher(callee: Callee) -> CallBatcher:
    return CallBatcher(callee.submit, callee.take)


def test_calls_made_in_one_loop_iteration_go_as_one_message_and_each_is_answered_when_it_ends():
    async def main():
        callee, gates = Callee(), {n: asyncio.Event() for n in "abc"}
        calls = batcher(callee)
        tasks = {n: asyncio.ensure_future(calls.call((n, gates[n]))) for n in "abc"}
        await asyncio.sleep(0.01)
        assert callee.submits == [[0, 1, 2]]  # one message for the three
        gates["b"].set()
        assert await asyncio.wait_for(tasks["b"], 1) == "b"  # not held for a or c
        assert not tasks["a"].done() and not tasks["c"].done()
        gates["a"].set(), gates["c"].set()
        assert [await tasks["a"], await tasks["c"]] == ["a", "c"]
        assert calls.waiting == 0

    asyncio.run(main())


def test_a_callee_error_fails_only_its_call_and_a_later_call_sends_a_new_message():
    async def main():
        callee, gate = Callee(), asyncio.Event()
        gate.set()
        calls = batcher(callee)
        good, bad = calls.call(("good", gate)), calls.call(("bad1", gate))
        results = await asyncio.gather(good, bad, return_exceptions=True)
        assert results[0] == "good" and isinstance(results[1], ValueError)
        assert await calls.call(("again", gate)) == "again"
        assert callee.submits == [[0, 1], [2]]

    asyncio.run(main())


def test_the_callee_dying_fails_every_waiting_call_with_its_error():
    async def main():
        callee, gate = Callee(), asyncio.Event()
        calls = batcher(callee)
        tasks = [asyncio.ensure_future(calls.call((n, gate))) for n in "xy"]
        await asyncio.sleep(0.01)
        callee.dead = RuntimeError("actor died")
        gate.set()  # the pending take wakes and raises
        for task in tasks:
            with pytest.raises(RuntimeError, match="actor died"):
                await asyncio.wait_for(task, 1)
        with pytest.raises(RuntimeError, match="actor died"):  # a later call: its submit raises
            await asyncio.wait_for(calls.call(("z", gate)), 1)

    asyncio.run(main())


def test_a_caller_that_stops_waiting_leaves_nothing_and_the_others_still_get_their_answers():
    async def main():
        callee, slow, fast = Callee(), asyncio.Event(), asyncio.Event()
        calls = batcher(callee)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(calls.call(("slow", slow)), 0.05)
        other = asyncio.ensure_future(calls.call(("fast", fast)))
        slow.set()  # the abandoned call's outcome arrives and is dropped
        await asyncio.sleep(0.01)
        fast.set()
        assert await asyncio.wait_for(other, 1) == "fast"
        assert calls.waiting == 0

    asyncio.run(main())


def test_the_outbox_answers_an_empty_take_after_its_wait_and_keeps_channels_apart():
    async def main():
        box = Outbox()
        assert await box.take("c", 0.01) == []
        box.start("c", [(7, asyncio.sleep(0, result="v"))])
        box.start("other", [(7, asyncio.sleep(0, result="w"))])
        assert await box.take("c", 1) == [(7, "v", None)]
        assert await box.take("other", 1) == [(7, "w", None)]

    asyncio.run(main())


def test_an_error_that_cannot_be_pickled_goes_back_as_its_text():
    class Local(Exception):  # a class defined in a function: pickle cannot find it by name
        pass

    async def fail():
        raise Local("the env broke")

    async def main():
        box = Outbox()
        box.start("c", [(1, fail())])
        [(seq, value, error)] = await box.take("c", 1)
        assert seq == 1 and value is None and type(error) is RuntimeError and "Local: the env broke" in str(error)

    asyncio.run(main())


def test_a_batcher_whose_loop_ended_mid_call_serves_the_next_loop():
    callee = Callee()
    calls = batcher(callee)

    async def abandoned():
        asyncio.ensure_future(calls.call(("never", asyncio.Event())))
        await asyncio.sleep(0)  # the loop ends with the call queued and its take pending

    async def later():
        gate = asyncio.Event()
        gate.set()
        return await asyncio.wait_for(calls.call(("later", gate)), 1)

    asyncio.run(abandoned())
    assert asyncio.run(later()) == "later"
