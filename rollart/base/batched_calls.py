"""Many concurrent calls from one process to one actor as few messages, each call still answered on its own.

Why: on a small machine an actor call costs far more than the work it carries — a Ray call from one async actor to
another used ~1 ms of CPU between the two ends (2 CPUs, Ray 2.60), while one call that carries 12 items cost ~0.15
ms per item. A trajectory of the single-turn job made three such calls (driver → env worker → LLM proxy → engine),
so most of the CPU outside generation and training was call overhead. Batching the calls per request would hold
each answer until its batch-mates finish (the barrier rollart exists to avoid); this module batches the messages
instead, and every answer still goes back as soon as it exists.

How: the caller's `CallBatcher.call(item)` queues the item; everything queued while the caller's event loop runs
one iteration goes as one `submit(items)` message; one `take()` at a time long-polls the callee for the answers
that exist (all of them: those of one engine step come back together), and each resolves its own caller. The
callee keeps an `Outbox` per caller (`channel`): `start` runs each item as its own task, `take` waits until at least
one has ended (at most `wait_s`) and returns every outcome ended so far.

In: the caller's two awaitables (`submit(items)`, `take()`; Ray actor calls in practice, any coroutine in tests).
Out: `await call(item)` → the callee's value for that item, or its exception raised again here.

Guarantees:
- An item's answer is handed to its caller with the first `take` after it ends; nothing waits for other items.
- A `submit` or `take` that raises (the callee died) fails every call waiting on this batcher with that error, so
  the caller's own failure handling (a retry elsewhere) sees what a direct call would have raised; a later call
  starts afresh.
- A caller that stops waiting (cancelled, timed out) leaves nothing behind: its answer is dropped when it comes.
- Items are keyed by a per-batcher sequence number, never by the caller's ids: two items with the same request id
  are two calls.
- The callee's outbox holds only outcomes not yet taken (a caller that died leaves at most the answers to the calls
  it had in flight). An error that cannot be pickled goes back as a RuntimeError with its text, so it fails its
  own call only.
Plain asyncio: Ray stays in the actors that use it.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
from typing import Any, Awaitable, Callable, Sequence

Outcome = tuple[int, Any, BaseException | None]  # (sequence number, value, error)


class CallBatcher:
    """The caller's side, bound to one event loop at a time: used from another, it starts afresh there (the calls
    of the loop before are dropped with it), so a caller with several loops at once keeps one per loop."""

    def __init__(self, submit: Callable[[list[tuple[int, Any]]], Awaitable[Any]],
                 take: Callable[[], Awaitable[Sequence[Outcome]]]) -> None:
        self._submit, self._take = submit, take
        self._seq = itertools.count()
        self._queued: list[tuple[int, Any]] = []
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()  # submits in flight (kept: an unreferenced task may vanish)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def waiting(self) -> int:
        """Calls not answered yet."""
        return len(self._waiting)

    async def call(self, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or the loop it was bound to has ended with the calls it held
            self._loop, self._queued, self._waiting, self._poller = loop, [], {}, None
        seq = next(self._seq)
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting[seq] = future
        if not self._queued:
            loop.call_soon(self._flush)  # everything queued in this loop iteration goes as one message
        self._queued.append((seq, item))
        if self._poller is None:
            self._poller = asyncio.ensure_future(self._poll())
        try:
            return await future
        finally:
            self._waiting.pop(seq, None)

    def _flush(self) -> None:
        items, self._queued = self._queued, []
        if items:
            task = asyncio.ensure_future(self._send(items))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _send(self, items: list[tuple[int, Any]]) -> None:
        try:
            await self._submit(items)
        except BaseException as exc:  # noqa: BLE001 — every waiting caller must hear of it
            self._fail_all(exc)
            if not isinstance(exc, Exception):
                raise

    async def _poll(self) -> None:
        try:
            while self._waiting:
                try:
                    outcomes = await self._take()
                except BaseException as exc:  # noqa: BLE001 — every waiting caller must hear of it
                    self._fail_all(exc)
                    if not isinstance(exc, Exception):
                        raise
                    return
                for seq, value, error in outcomes:
                    future = self._waiting.get(seq)
                    if future is None or future.done():
                        continue  # its caller stopped waiting
                    if error is not None:
                        future.set_exception(error)
                    else:
                        future.set_result(value)
        finally:
            if self._poller is asyncio.current_task():
                self._poller = None  # (no await between the last check of `_waiting` and here)

    def _fail_all(self, exc: BaseException) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(exc)

    def close(self) -> None:
        """Stop polling (the callee is gone or no longer used); calls still waiting are cancelled."""
        for future in self._waiting.values():
            future.cancel()
        if self._poller is not None:
            self._poller.cancel()


class Outbox:
    """The callee's side: outcomes of started items by caller channel, until the caller takes them."""

    def __init__(self) -> None:
        self._done: dict[str, list[Outcome]] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, channel: str, items: Sequence[tuple[int, Awaitable[Any]]]) -> None:
        """Run each item's awaitable as its own task; its outcome goes to `channel`'s outbox when it ends."""
        for seq, work in items:
            task = asyncio.ensure_future(work)
            self._tasks.add(task)
            task.add_done_callback(lambda t, s=seq: self._put(channel, s, t))

    def _put(self, channel: str, seq: int, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            outcome: Outcome = (seq, None, asyncio.CancelledError(f"call {seq} was cancelled in the callee"))
        elif task.exception() is not None:
            outcome = (seq, None, _sendable(task.exception()))
        else:
            outcome = (seq, task.result(), None)
        self._done.setdefault(channel, []).append(outcome)
        self._event(channel).set()

    def _event(self, channel: str) -> asyncio.Event:
        event = self._ready.get(channel)
        if event is None:
            event = self._ready[channel] = asyncio.Event()
        return event

    async def take(self, channel: str, wait_s: float) -> list[Outcome]:
        """Every outcome of `channel` ended so far, once there is one (or [] after `wait_s`)."""
        event = self._event(channel)
        if not self._done.get(channel):
            try:
                await asyncio.wait_for(event.wait(), wait_s)
            except asyncio.TimeoutError:
                return []
        event.clear()
        return self._done.pop(channel, [])

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _sendable(error: BaseException) -> BaseException:
    """`error` if it pickles, else a RuntimeError with its text: one outcome that cannot cross to the caller must not
    fail the whole `take` (and with it every other caller's answer)."""
    try:
        pickle.dumps(error)
    except Exception:  # noqa: BLE001 — any reason it cannot be sent
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
