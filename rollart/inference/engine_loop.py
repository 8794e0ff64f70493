"""`EngineLoop`: drives an `InferenceEngine` on its own thread and answers asyncio callers per request.

In: an engine, and from any asyncio task: `generate(request)`, `abort_trajectory(id)`, `preempt_trajectory(id)`,
`call(fn)`.
Out: each request's `GenerationResult`, the moment the engine step that finished it returns.

Why a thread: engine steps are blocking compute; running them off the event loop keeps an async Ray
actor responsive, so ADD/ABORT commands land between any two steps (the paper's inference worker).

Guarantees:
- Commands run on the engine thread, in the order they were sent, only between steps (so every engine
  call happens at a step boundary, as the `InferenceEngine` contract requires).
- A finished request resolves its caller's future at once (`loop.call_soon_threadsafe`, one for all the
  requests a step finished), never held for a later step.
- An aborted trajectory is remembered (bounded): a request of it that arrives later — e.g. an ADD that
  raced with the ABORT — returns an aborted, empty result instead of running.
- A preempted trajectory (`preempt_trajectory`: the LLM proxy moving its turn to another worker) has only its
  queued and running requests aborted; it is not remembered, so its later turns may come back here.
- The thread never spins: with no work it blocks on the command queue. If a step raises, every waiting
  caller gets the error and the loop refuses new work (an engine in an unknown state must not serve).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from rollart.inference.protocol import InferenceEngine
from rollart.inference.results import aborted_result
from rollart.types import GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

_REMEMBERED_ABORTS = 65536


class EngineLoop:
    def __init__(self, engine: InferenceEngine, name: str = "", idle_wait_s: float = 0.1) -> None:
        self.engine = engine
        self.name = name
        self._idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # request id → (the caller's event loop, its future, the request's trajectory id)
        self._waiters: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future, str]] = {}
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self._failure: BaseException | None = None
        self._stop = threading.Event()
        self.busy_s = 0.0  # seconds the engine spent in its steps (written by the engine thread only)
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)
        self._thread.start()

    # --- called from the event loop ----------------------------------------------------------------------

    async def generate(self, request: GenerationRequest, timeout_s: float) -> GenerationResult:
        """Queue `request`; return its result (finish reason stop/length/abort) or raise TimeoutError."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        rid = request.request_id
        if rid in self._waiters:
            raise ValueError(f"{self.name}: request_id={rid!r} is already in flight on this worker")
        self._waiters[rid] = (loop, future, request.trajectory_id)

        def add() -> None:
            if request.trajectory_id in self._aborted:
                self._deliver(aborted_result(request, self.name))
                return
            try:
                self.engine.add(request)
            except Exception as exc:  # noqa: BLE001 — a bad request fails its caller only
                self._fail(rid, exc)

        self._commands.put(add)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.TimeoutError:
            self._commands.put(lambda: self.engine.abort(rid))
            raise TimeoutError(
                f"{self.name}: request {rid!r} of trajectory {request.trajectory_id!r} did not finish within "
                f"{timeout_s:g} s (inference.request_timeout_s); it was aborted"
            ) from None
        except asyncio.CancelledError:
            self._commands.put(lambda: self.engine.abort(rid))  # nobody will read the result
            raise
        finally:
            self._waiters.pop(rid, None)

    def abort_trajectory(self, trajectory_id: str) -> None:
        """Abort every queued or running request of `trajectory_id`, now and for requests still to come."""
        self._aborted[trajectory_id] = None
        while len(self._aborted) > _REMEMBERED_ABORTS:
            self._aborted.popitem(last=False)

        self.preempt_trajectory(trajectory_id)

    def preempt_trajectory(self, trajectory_id: str) -> None:
        """Abort the queued or running requests of `trajectory_id` (they return `finish_reason="abort"` with the
        tokens so far); its later requests run as usual."""
        ids = [rid for rid, waiter in self._waiters.items() if waiter[2] == trajectory_id]

        def abort() -> None:  # runs after the ADDs of `ids` (commands run in order)
            for rid in ids:
                self.engine.abort(rid)

        self._commands.put(abort)

    def preempt_all(self) -> int:
        """`preempt_trajectory` for every request here; how many there were."""
        ids = list(self._waiters)
        self._commands.put(lambda: [self.engine.abort(rid) for rid in ids])
        return len(ids)

    async def call(self, fn: Callable[[InferenceEngine], Any], timeout_s: float = 600.0) -> Any:
        """Run `fn(engine)` on the engine thread at the next step boundary and return its value."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def run() -> None:
            try:
                value = fn(self.engine)
            except Exception as exc:  # noqa: BLE001 — re-raised in the caller
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, value, None)

        self._commands.put(run)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{self.name}: engine command did not run within {timeout_s:g} s") from None

    @property
    def in_flight(self) -> int:
        return len(self._waiters)

    def close(self) -> None:
        self._stop.set()
        self._commands.put(lambda: None)
        self._thread.join(timeout=10)

    # --- the engine thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not self.engine.has_work())
            if self._stop.is_set() or not self.engine.has_work():
                continue
            began = time.perf_counter()
            try:
                results = self.engine.step()
            except BaseException as exc:  # noqa: BLE001 — every caller must hear of it
                log.exception("%s: engine step failed; the worker stops serving", self.name)
                self._failure = exc
                for rid in list(self._waiters):
                    self._fail(rid, RuntimeError(f"{self.name}: engine step failed: {exc!r}"))
                return
            finally:
                self.busy_s += time.perf_counter() - began
            self._deliver_all(results)

    def _drain(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=self._idle_wait_s) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            command()
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _deliver_all(self, results: list[GenerationResult]) -> None:
        """A step's finished requests, handed over with one wake-up of each caller's loop (not one per result: a
        step of a single-turn batch finishes dozens at once), each to its own future."""
        if len(results) == 1:
            self._deliver(results[0])
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, GenerationResult]]] = {}
        for result in results:
            waiter = self._waiters.get(result.request_id)
            if waiter is not None:
                by_loop.setdefault(waiter[0], []).append((waiter[1], result))
        for loop, settled in by_loop.items():
            loop.call_soon_threadsafe(_settle_each, settled)

    def _deliver(self, result: GenerationResult) -> None:
        waiter = self._waiters.get(result.request_id)
        if waiter is not None:
            waiter[0].call_soon_threadsafe(_settle, waiter[1], result, None)

    def _fail(self, request_id: str, exc: BaseException) -> None:
        waiter = self._waiters.get(request_id)
        if waiter is not None:
            waiter[0].call_soon_threadsafe(_settle, waiter[1], None, exc)

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"{self.name}: the engine failed earlier and serves no more: {self._failure!r}")


def _settle_each(settled: list[tuple[asyncio.Future, GenerationResult]]) -> None:
    for future, result in settled:
        _settle(future, result, None)


def _settle(future: asyncio.Future, value: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)

