"""Background weight prefetch: pull the newest published version while the engine keeps generating.

In: a `rollart.types.WeightSubscriber` (the weights plane's, injected by the driver), the version the
engine serves, and optionally `prepare` (the engine's `prepare_weights`: e.g. a LoRA merge), run on a
thread after each background pull. Out: `await take(version)` — that version's tensors, already pulled
(and prepared) if the background pull got them, else pulled now, unprepared — and timing: how long pulls
and preparation took in the background versus how long a swap had to wait for a pull (the exposed part of
a weight update).

It runs as an asyncio task on the inference worker's own event loop (`start()` from a coroutine): the
subscriber's calls are coroutines that await Ray's object refs, so nothing here blocks the loop that
serves generation requests, and no thread is needed.

Guarantees: only versions newer than the served one are pulled; at most one prefetched version is held
(a newer one replaces an older); a `take` of the version being pulled waits for that pull (bounded by
`wait_s`) instead of pulling it twice; the task polls every `poll_s` seconds and stops on `close()`; a pull
that raises is recorded in `last_error` and retried at the next poll, never crashing the worker.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from rollart.types import WeightSubscriber


class WeightPrefetcher:
    def __init__(
        self, subscriber: WeightSubscriber, inference_version: int, poll_s: float = 0.5, wait_s: float = 300.0,
        prepare: Callable[[Any], Any] | None = None,
    ) -> None:
        self._subscriber = subscriber
        self._prepare = prepare
        self._inference_version = inference_version
        self._poll_s = poll_s
        self._wait_s = wait_s
        self._ready: tuple[int, Any] | None = None  # the prefetched version and its tensors
        self._pulling: tuple[int, asyncio.Future[Any]] | None = None  # the background pull in progress
        self._task: asyncio.Task[None] | None = None
        self.background_pull_s = 0.0
        self.background_pulls = 0
        self.background_prepare_s = 0.0
        self.exposed_pull_s = 0.0
        self.exposed_pulls = 0
        self.last_error = ""

    def start(self) -> None:
        """Start polling on the running event loop (idempotent; call it from a coroutine)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="weight-prefetch")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                latest = await self._subscriber.latest_version()
                if latest > max(self._inference_version, self._ready[0] if self._ready else -1):
                    await self._pull_in_background(latest)
            except Exception as exc:  # noqa: BLE001 — reported in stats, retried at the next poll
                self.last_error = f"{type(exc).__name__}: {exc}"

    async def _pull_in_background(self, version: int) -> None:
        start = time.perf_counter()
        pull = asyncio.ensure_future(self._pull_and_prepare(version))
        self._pulling = (version, pull)  # a `take` of this version waits for the prepared tensors
        try:
            tensors = await pull
        finally:
            self._pulling = None
        self.background_pull_s += time.perf_counter() - start
        self.background_pulls += 1
        if version > self._inference_version and (self._ready is None or version > self._ready[0]):
            self._ready = (version, tensors)

    async def _pull_and_prepare(self, version: int) -> Any:
        tensors = await self._subscriber.pull(version)
        if self._prepare is None:
            return tensors
        start = time.perf_counter()
        prepared = await asyncio.to_thread(self._prepare, tensors)  # a thread: the loop serves generation meanwhile
        self.background_prepare_s += time.perf_counter() - start
        return prepared

    async def take(self, version: int) -> Any:
        """Tensors of `version` (prefetched if available, else pulled now); marks it as served."""
        start = time.perf_counter()
        tensors = await self._in_flight(version)
        ready = self._ready
        if ready is not None and ready[0] <= version:
            self._ready = None
        self._inference_version = max(self._inference_version, version)
        if tensors is None and ready is not None and ready[0] == version:
            tensors = ready[1]
        if tensors is None:
            tensors = await self._subscriber.pull(version)
            self.exposed_pulls += 1
        self.exposed_pull_s += time.perf_counter() - start
        return tensors

    async def _in_flight(self, version: int) -> Any | None:
        """The tensors of the background pull of `version` if one is in progress (waited for, at most
        `wait_s`), else None."""
        if self._pulling is None or self._pulling[0] != version:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(self._pulling[1]), self._wait_s)
        except Exception:  # noqa: BLE001 — that pull failed or is too slow: the caller pulls on its own
            return None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        close = getattr(self._subscriber, "close", None)  # a subscriber with a receiving thread of its own
        if close is not None:
            close()

    def stats(self) -> dict[str, float]:
        return {
            "prefetched_version": float(self._ready[0]) if self._ready else -1.0,
            "pull_s_background": self.background_pull_s,
            "pulls_background": float(self.background_pulls),
            "prepare_s_background": self.background_prepare_s,
            "pull_s_exposed": self.exposed_pull_s,
            "pulls_exposed": float(self.exposed_pulls),
        }
