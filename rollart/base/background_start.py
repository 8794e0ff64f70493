"""Start one part of a job on a background thread while the caller starts another: `BackgroundStart`.

In: what is being started (for messages) and a function that starts it, registering how to stop it on the
`ExitStack` it is given. Out: `join(into=stack)` — its result, its stop callbacks moved onto the caller's
stack (so one `close()` stops both parts) — or its error, re-raised in the caller.

Why: a job's parts start processes and wait for them — the trainer's ranks, the inference engines, the env
workers, Ray Serve's reward app. One after another they took ~60 s on a 2-core machine, with one core idle
most of the time (a new process's imports run on one core); two chains side by side overlap them.

Guarantees:
- Nothing started leaks: if the caller gives up (its own part failed, or Ctrl-C), `abandon()` stops what the
  background part has started — at once if it is done, otherwise the moment it returns (on its own thread).
- The thread is a daemon: the interpreter never waits for a part that was abandoned.
- `join` is bounded (`timeout_s`, with a message naming the part); the function's own waits are bounded too
  (placement and start timeouts), which is what keeps the thread from running on for ever.
- Stopping an abandoned or failed part never raises out of the thread or out of `abandon` (a stop callback
  may fail when Ray has already been shut down by a Ctrl-C): it is one warning naming the part, so the
  caller's own error is the one the user sees, and `join` is always told the part ended.
"""

from __future__ import annotations

import logging
import threading
from contextlib import ExitStack
from typing import Callable, Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("rollart")


class BackgroundStart(Generic[T]):
    def __init__(self, what: str, start: Callable[[ExitStack], T]) -> None:
        self.what = what
        self._start = start
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._abandoned = False
        self._stack: ExitStack | None = None
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"rollart-start: {what}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stack = ExitStack()
        try:
            result = self._start(stack)
        except BaseException as exc:  # handed to the caller by join
            self._error = exc
            self._stop(stack, "it failed to start")
            self._done.set()
            return
        with self._lock:
            abandoned = self._abandoned
            if not abandoned:
                self._stack, self._result = stack, result
        if abandoned:  # the caller has gone: stop what was started (nobody else will)
            self._stop(stack, "the caller gave up on it")
        self._done.set()

    def join(self, into: ExitStack, timeout_s: float) -> T:
        """Wait for the part; move its stop callbacks onto `into` and return its result, or raise its error."""
        if not self._done.wait(timeout_s):
            self.abandon()
            raise TimeoutError(f"{self.what} did not finish within {timeout_s:.0f} s")
        if self._error is not None:
            raise self._error
        with self._lock:
            stack, self._stack = self._stack, None
        assert stack is not None, f"{self.what}: joined twice"
        into.enter_context(stack)
        return self._result  # type: ignore[return-value]

    def abandon(self) -> None:
        """The caller will not join: stop what the part started, now if it is done, else when it returns."""
        with self._lock:
            self._abandoned = True
            stack, self._stack = self._stack, None
        if stack is not None:
            self._stop(stack, "the caller gave up on it")

    def _stop(self, stack: ExitStack, when: str) -> None:
        try:
            stack.close()
        except Exception as exc:  # noqa: BLE001 - the part is gone either way; the caller's error matters more
            log.warning("%s: could not stop what it had started (%s): %s: %s", self.what, when, type(exc).__name__, exc)
