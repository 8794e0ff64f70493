"""Ctrl-C that stops a job within seconds at any phase: `run(main)`, `asyncio.run` with its own SIGINT handling.

In: a coroutine (a training job, an evaluation). Out: its result, or `KeyboardInterrupt` once it has stopped.

Why not asyncio's own handler: it only cancels the main task, which takes effect at the task's next await.
A phase that runs synchronously on the event loop's thread — starting Ray, placing workers, the supervised
warm start, stopping what was started — went on for as long as it took (minutes, at a large config) with
Ctrl-C pressed. Here:
- the first SIGINT cancels the main task if the loop is waiting (so every `finally` runs: the system is
  stopped, the run directory keeps what was done); if the main task is running synchronous code,
  `KeyboardInterrupt` is raised in that code instead, which unwinds through the same `finally` blocks; if
  another task holds the loop's thread for a moment (an episode's HTTP call importing a module), the main
  task is cancelled at the loop's next turn — raised there, the interrupt would end that task with an
  exception nobody reads, which asyncio prints with its traceback;
- a second SIGINT, or a job still not ended `grace_s` after the first (a teardown that hangs), raises
  `KeyboardInterrupt` at once, wherever the main thread is;
- once interrupted, `interrupted()` is true (for a part that would otherwise mend the job's own processes dying
  of the same Ctrl-C, e.g. rebuild trainer ranks), and the job ends with `KeyboardInterrupt` whatever it raised
  while stopping (`Interrupted`, or a failure the stop itself caused).
Off the main thread (where no signal arrives) it is plain `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from types import FrameType
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
GRACE_S = 8.0
# Set by the first Ctrl-C of a job `run` runs, until it has stopped: the job's own processes (Ray's workers share
# the terminal's process group, so they get the same SIGINT and die of it) are going away because the user said
# so, not because something failed — `interrupted()` lets whoever would mend such a death (the trainer ranks) stand
# down instead of saying "died … rebuilding" to a user who pressed Ctrl-C.
_INTERRUPTED = threading.Event()


def interrupted() -> bool:
    """Whether the job this process runs was interrupted (Ctrl-C) and is stopping."""
    return _INTERRUPTED.is_set()


class Interrupted(Exception):
    """A part of a job stopped because the job was interrupted (its processes got the same Ctrl-C): `run` ends
    the job with `KeyboardInterrupt`, as for the Ctrl-C itself."""

log = logging.getLogger("rollart")


def handles(handler: Any) -> bool:
    """Whether `handler` (a `signal.getsignal` result) is the SIGINT handler of a job `run` runs."""
    return getattr(handler, "__self__", None).__class__ is _Interrupts


def run(main: Coroutine[Any, Any, T], grace_s: float = GRACE_S) -> T:
    """`asyncio.run(main)`, stopped by Ctrl-C at any phase (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(main)
    interrupts = _Interrupts(grace_s)
    previous = signal.signal(signal.SIGINT, interrupts.handle)  # asyncio.Runner then leaves SIGINT to us
    try:
        with asyncio.Runner() as runner:
            interrupts.loop = runner.get_loop()
            return runner.run(interrupts.track(main))
    except asyncio.CancelledError:
        if interrupts.count:
            raise KeyboardInterrupt from None
        raise
    except Exception:  # (Interrupted, or whatever failed of the job's own being stopped)
        if interrupts.count:
            raise KeyboardInterrupt from None
        raise
    finally:
        interrupts.done.set()
        _INTERRUPTED.clear()
        signal.signal(signal.SIGINT, previous)


class _Interrupts:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.count = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.done = threading.Event()

    async def track(self, main: Coroutine[Any, Any, T]) -> T:
        self.task = asyncio.current_task()
        return await main

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        _INTERRUPTED.set()
        if self.count > 1 or self.loop is None or self.task is None or self.task.done():
            raise KeyboardInterrupt
        log.warning("interrupted: stopping what this job started (Ctrl-C again to stop at once)")
        threading.Thread(target=self._deadline, name="interrupt-deadline", daemon=True).start()
        if asyncio.current_task(self.loop) is not self.task:  # waiting, or another task's step: stop at an await
            self.loop.call_soon_threadsafe(self.task.cancel)
            return
        raise KeyboardInterrupt  # the job's own synchronous code on the loop's thread: unwind it now

    def _deadline(self) -> None:
        if not self.done.wait(self.grace_s):
            log.warning("interrupted: still stopping after %gs: stopping at once", self.grace_s)
            # a real signal (interrupt_main only sets a flag, which a blocking call does not see): the
            # handler's second call, KeyboardInterrupt wherever the main thread is
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
