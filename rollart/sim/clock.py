"""A discrete-event asyncio event loop: virtual time that jumps to the next timer when nothing is runnable.

In: any coroutine (the production control plane, the simulated workers). Out: its result, computed in
virtual time — `loop.time()` starts at 0 and moves only when every task waits: then the clock jumps to the
earliest timer (an `asyncio.sleep`, a `wait_for` deadline, a `call_at`). Nothing really sleeps, so an hour
of a 1,000-GPU cluster runs in the seconds its events take to process.

How: asyncio's `_run_once` asks its selector to wait until the next timer is due. `_VirtualSelector`
answers at once, and advances the loop's virtual clock by that wait instead of sleeping. Real I/O still
works: work handed to threads (`run_in_executor`, `asyncio.to_thread`, e.g. a checkpoint written in a
thread) is counted, and while any is pending the selector waits for it for real — it takes no virtual
time. A loop with no timer, no runnable task and no thread work can never progress: that is a deadlock
of the simulated system, raised as `SimulationDeadlock` instead of hanging; so is a livelock (a million
loop iterations without virtual time moving).

Cost (the twin's speed is its event rate): timers are kept as `(when, seq, handle)` tuples in the loop's
heap, so ordering them is a C-level tuple comparison rather than `TimerHandle.__lt__` in Python (a
10,000-trajectory twin holds tens of thousands of timers: every wait has a timeout); timers due at the
same instant fire in the order they were set; callbacks made ready at one instant run in passes of one
`_run_once` (asyncio's iterations, in asyncio's order, without a selector round trip each). Timers due
more than `FAR_TIMER_S` ahead wait in a second heap and join the loop's heap only as the clock nears them:
nearly all of a twin's timers are such deadlines (a trajectory's timeout, each turn's call timeout: hours
ahead, and most cancelled when the wait ends), so the heap every event goes through holds only what is
due soon (a few thousand timers at 10,000 GPUs instead of a few hundred thousand, most of them cancelled),
and the order timers fire in is unchanged. While a
simulation runs, the garbage collector's young generation is collected only once a million more objects
are alive than at its last collection (or as many as the memory blocks alive, if more: once the heap has
doubled), instead of 700: the twin's objects are freed by reference counting
(a trained batch's turns, a finished turn's records; its collections found no cyclic garbage at all), so
the default walked the live trajectories over and over for nothing — a sixth of the run even at 100,000 —,
while the limit still collects cycles that a faulty run's errors may leave (restored when the last
running simulation ends).

Written here rather than taken from `looptime` (a pytest plugin that patches the test loop's clock)
because the twin needs a standalone loop that also knows about executor work and fails on deadlock.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import selectors
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from heapq import heapify, heappop, heappush
from operator import getitem
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

T = TypeVar("T")

THREAD_WAIT_S = 600.0  # longest real wait for thread work before the simulation gives up
LIVELOCK_ITERATIONS = 1_000_000  # loop iterations at one virtual instant before it is called a livelock
GC_YOUNG_THRESHOLD = 1_000_000  # net new objects between young-generation collections while a simulation runs
FAR_TIMER_S = 300.0  # timers due further ahead than this wait outside the loop's heap (VirtualTimeLoop._far)


class SimulationDeadlock(RuntimeError):
    """Nothing can ever run again: no timer, no runnable task, no thread work."""


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        assert loop is not None
        if loop.threads_pending:  # thread work: wait for it in real time (it costs no virtual time)
            events = super().select(THREAD_WAIT_S if timeout is None or timeout > 0 else 0)
            if not events and timeout is None:
                raise SimulationDeadlock(f"thread work did not finish within {THREAD_WAIT_S:.0f}s of real time")
            return events
        loop.iterations += 1
        if loop.iterations % 1024 == 0:  # now and then, look at real fds (a call_soon_threadsafe, a signal)
            events = super().select(0)
            if events:
                return events
        if timeout is None:
            raise SimulationDeadlock(
                "the simulated system waits for something that can never happen (no timer, no runnable task, "
                f"no thread work) at virtual time {loop.time():.3f}s"
            )
        if timeout > 0:
            loop.advance(timeout)
            loop.same_instant = 0
        else:
            loop.same_instant += 1
            if loop.same_instant > LIVELOCK_ITERATIONS:
                raise loop._livelock()
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual (seconds since the simulation began)."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._clock = [0.0]
        # asyncio asks for the time and the debug flag on every callback: C-level callables (no Python frame)
        self.time = partial(getitem, self._clock, 0)  # type: ignore[method-assign]
        self.get_debug = partial(getattr, self, "_debug")  # type: ignore[method-assign]
        self.threads_pending = 0
        self.iterations = 0
        self.same_instant = 0  # iterations since virtual time last moved
        self._clock_resolution = 1e-9  # timers due within this are run together
        self._timer_seq = itertools.count()  # ties between timers due at the same instant: first set, first run
        # Timers due at or after `_horizon` wait in `_far` (a heap of the same tuples), those before it in
        # `_scheduled`; the horizon stays at least FAR_TIMER_S / 2 ahead of the clock and moves only forward,
        # taking the far timers it passes into `_scheduled` (`_bring_near`).
        self._far: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._far_cancelled = 0
        self._horizon = FAR_TIMER_S

    def advance(self, seconds: float) -> None:
        self._clock[0] += seconds

    # --- timers: a heap of (when, seq, handle) tuples in `_scheduled` (asyncio's own list, so `close()`
    # clears it), compared in C; the rest is asyncio's `call_at` and `_run_once`, less the debug paths
    # that do not change what runs
    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: Any = None) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        if self._debug:
            self._check_thread()
            self._check_callback(callback, "call_at")
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        if timer._source_traceback:
            del timer._source_traceback[-1]
        heappush(self._scheduled if when < self._horizon else self._far, (when, next(self._timer_seq), timer))
        timer._scheduled = True
        return timer

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        if handle._scheduled:  # (in `_far` exactly when due at or after the horizon)
            if handle._when < self._horizon:
                self._timer_cancelled_count += 1
            else:
                self._far_cancelled += 1

    def _bring_near(self) -> None:
        """Move the horizon to FAR_TIMER_S past the clock — past the earliest far timer if no near one is
        left — and the far timers before it into `_scheduled`; cancelled far timers are dropped (all of them
        once they are most of `_far`)."""
        far = self._far
        if self._far_cancelled * 2 > len(far):
            live = []
            for entry in far:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    live.append(entry)
            heapify(live)
            self._far = far = live
            self._far_cancelled = 0
        while far and far[0][2]._cancelled:
            self._far_cancelled -= 1
            heappop(far)[2]._scheduled = False
        horizon = max(self._horizon, self._clock[0] + FAR_TIMER_S)
        if far and not self._scheduled:
            horizon = max(horizon, far[0][0] + FAR_TIMER_S)
        self._horizon = horizon
        scheduled = self._scheduled
        while far and far[0][0] < horizon:
            entry = heappop(far)
            if entry[2]._cancelled:
                self._far_cancelled -= 1
                entry[2]._scheduled = False
            else:
                heappush(scheduled, entry)

    def close(self) -> None:
        super().close()
        self._far.clear()

    def _run_once(self) -> None:
        scheduled = self._scheduled
        if len(scheduled) > 100 and self._timer_cancelled_count * 2 > len(scheduled):
            live = []  # mostly cancelled timers (the timeouts of waits that ended): drop them at once
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    live.append(entry)
            heapify(live)
            self._scheduled = scheduled = live
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                self._timer_cancelled_count -= 1
                heappop(scheduled)[2]._scheduled = False
        far = self._far
        if far and (not scheduled or self._clock[0] + FAR_TIMER_S / 2 >= self._horizon
                    or self._far_cancelled * 2 > len(far) > 100):
            self._bring_near()
        ready = self._ready
        if ready or self._stopping:
            timeout: float | None = 0
        elif scheduled:
            timeout = max(0.0, scheduled[0][0] - self._clock[0])
        else:
            timeout = None
        self._process_events(self._selector.select(timeout))
        end_time = self._clock[0] + self._clock_resolution
        if self._far and end_time > self._horizon:  # (a near timer within the resolution of the horizon)
            self._bring_near()
        while True:
            while scheduled and scheduled[0][0] < end_time:
                handle = heappop(scheduled)[2]
                handle._scheduled = False
                ready.append(handle)
            for _ in range(len(ready)):  # what is ready now; callbacks scheduled by these run in the next pass
                handle = ready.popleft()
                if not handle._cancelled:
                    handle._run()
            # The next pass is asyncio's next iteration at the same virtual instant (same order: timers due
            # now after what is ready), without the round trip through run_forever and the selector, which
            # has nothing to wait for; thread work and a stop still go back through them.
            if not ready or self._stopping or self.threads_pending:
                break
            self.same_instant += 1
            if self.same_instant > LIVELOCK_ITERATIONS:
                raise self._livelock()
        handle = None  # (breaks a cycle when an exception occurred)

    def _livelock(self) -> SimulationDeadlock:
        return SimulationDeadlock(
            f"the simulated system ran {LIVELOCK_ITERATIONS:,} loop iterations without virtual time moving "
            f"(at {self.time():.3f}s): a livelock, e.g. work that fails and is replaced at once, forever"
        )

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_pending += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future) -> None:
        self.threads_pending -= 1


def run_virtual(main: Coroutine[Any, Any, T] | Callable[[], Awaitable[T]]) -> T:
    """Run `main` (a coroutine, or a function returning an awaitable) to completion in virtual time."""
    with _fewer_collections():
        return _run(main)


_gc_lock = threading.Lock()
_gc_runs = 0  # simulations running now (a planner runs twins in threads, beside the one that asked it)
_gc_default: tuple[int, ...] = ()


@contextmanager
def _fewer_collections() -> Any:
    """The young generation collected every `GC_YOUNG_THRESHOLD` allocations — or once as many as the
    memory blocks alive, whichever is more — while any simulation runs."""
    global _gc_runs, _gc_default
    with _gc_lock:
        if _gc_runs == 0:
            _gc_default = gc.get_threshold()
            gc.set_threshold(GC_YOUNG_THRESHOLD, *_gc_default[1:])
            gc.callbacks.append(_scale_young_threshold)
        _gc_runs += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_runs -= 1
            if _gc_runs == 0:
                gc.callbacks.remove(_scale_young_threshold)
                gc.set_threshold(*_gc_default)


def _scale_young_threshold(phase: str, info: dict[str, int]) -> None:
    """After each collection: the next one once the heap has doubled (as many new objects as memory blocks
    alive). A collection costs more the larger the heap it reaches into, so the gap between collections
    grows with the heap: the twin then collects while its pipeline fills, and not in its steady state, at any
    scale. (At a quarter of the heap, a 10,000-GPU twin passed the gap within a step, as its second batch's
    turns piled up — a 3–17 s collection that found nothing, 19–22 µs a turn of collections against 6 at
    1,000 GPUs, whose steady growth stayed under the million.) Garbage cycles (a faulty run's errors) may
    take as much memory again as the heap before they are collected. `sys.getallocatedblocks()` is O(1)."""
    if phase == "stop":
        young = max(GC_YOUNG_THRESHOLD, sys.getallocatedblocks())
        if young != gc.get_threshold()[0]:
            gc.set_threshold(young, *gc.get_threshold()[1:])


def _run(main: Coroutine[Any, Any, T] | Callable[[], Awaitable[T]]) -> T:
    loop = VirtualTimeLoop()
    threads = ThreadPoolExecutor(4, thread_name_prefix="rollart-sim")
    loop.set_default_executor(threads)
    try:
        asyncio.set_event_loop(loop)
        coro = main() if callable(main) else main
        return loop.run_until_complete(coro)
    finally:
        try:  # whatever is left (after a deadlock, a livelock or an error) is cancelled, then async generators
            loop.same_instant = 0
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except SimulationDeadlock:
            pass  # cleanup that cannot finish either: the error that stopped the run is the one to see
        finally:
            asyncio.set_event_loop(None)
            loop.close()
            threads.shutdown(wait=True)


def now() -> float:
    """The running loop's clock (virtual inside `run_virtual`)."""
    return asyncio.get_running_loop().time()
