"""`asyncio.timeout` for many concurrent waits of the same length, with one timer between them all.

Why: the LLM proxy bounds every turn it forwards (a worker that hangs must not hang its trajectory), so one proxy
process holding thousands of turns in flight made a timer for each (an `asyncio.TimerHandle` on the loop's heap,
cancelled a moment later when the turn ended) — with the collection's and the reward client's, about a third of
the event loop's timers in the twin at 1,000 GPUs. Waits that all last the same `seconds` end in the order they
began, so their deadlines form a queue: one timer, armed for the oldest wait still running, is enough. (The
running waits are kept in an `OrderedDict`: a wait that ends leaves it at once, in O(1), and the oldest is its
first entry.)

In: `seconds`, then `async with deadlines.bound():` around an await, in a task. Out: what `asyncio.timeout(seconds)`
does there — past its deadline the task is cancelled and the block raises `TimeoutError` (the `CancelledError`
kept as its cause); a cancel from anyone else passes through as it is. Guarantees: a wait is cancelled no earlier
than `seconds` after it began and, while the loop runs, no later than when its own timer would have fired; only
running waits are held (an ended one is forgotten as it ends); nothing needs closing — the timer fires at most
once per deadline of a wait that was running when it was set.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from types import TracebackType


class _Wait:
    __slots__ = ("deadline", "task", "cancelling", "expired")

    def __init__(self, deadline: float, task: asyncio.Task) -> None:
        self.deadline, self.task = deadline, task
        self.cancelling = task.cancelling()  # cancels already requested when the wait began (not ours to undo)
        self.expired = False


class Deadlines:
    """Bounds for waits of `seconds` each (see the module docstring)."""

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"Deadlines: seconds must be > 0, not {seconds!r}")
        self.seconds = seconds
        self._waits: OrderedDict[_Wait, None] = OrderedDict()  # running waits in the order begun, so by deadline
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the waits and the timer belong to

    def bound(self) -> _Bound:
        return _Bound(self)

    def _begin(self) -> _Wait:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.bound() must be used inside a task")
        loop = task.get_loop()
        if loop is not self._loop:  # (a new loop: whatever ran on the last one can no longer end or fire)
            self._loop, self._timer = loop, None
            self._waits.clear()
        wait = _Wait(loop.time() + self.seconds, task)
        self._waits[wait] = None
        if self._timer is None:
            self._timer = loop.call_at(wait.deadline, self._fire, loop)
        return wait

    def _end(self, wait: _Wait) -> None:
        self._waits.pop(wait, None)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel every running wait past its deadline and arm the timer for the oldest one left."""
        self._timer = None
        now, waits = loop.time(), self._waits
        while waits:
            wait = next(iter(waits))
            if wait.deadline > now:
                self._timer = loop.call_at(wait.deadline, self._fire, loop)
                return
            del waits[wait]
            wait.expired = True
            wait.task.cancel()


class _Bound:
    __slots__ = ("deadlines", "wait")

    def __init__(self, deadlines: Deadlines) -> None:
        self.deadlines = deadlines

    async def __aenter__(self) -> None:
        self.wait = self.deadlines._begin()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        wait = self.wait
        self.deadlines._end(wait)
        if wait.expired and wait.task.uncancel() <= wait.cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
