"""A warm pool of prepared environments for one domain on one env worker, refilled in the background.

In: the domain's env factory, how many prepared envs to keep (`envs.warm_pool.size`), the thread pool
sync env calls run in, and bounds (prepare timeout, backoff after failures). Out: `acquire()` → (an
`AsyncEnv` ready to be reset, whether it came from the pool). A miss (pool empty) builds and prepares
an env on the spot, so a reset never waits on the pool's refill.

"Prepared" is the part of a reset that does not depend on the seed: the env's constructor and its
optional `prepare()` (the SWE domain creates its workspace sandbox there). A reset then only seeds it.

Guarantees: at most `size` envs are ready or being prepared at once (bounded memory, bounded leftovers);
refill is one env at a time, after every acquire, with exponential backoff while prepares keep failing
(a failing domain does not spin a CPU); every env the pool made is either handed out by `acquire` or
closed by `close()` — also one whose construction was still running in a thread when the pool closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import Executor
from typing import Any

from rollart.envs.protocol import AsyncEnv, EnvFactory

log = logging.getLogger(__name__)


class WarmPool:
    def __init__(self, domain: str, factory: EnvFactory, size: int, *, executor: Executor | None = None,
                 prepare_timeout_s: float = 60.0, backoff_s: float = 0.2, backoff_max_s: float = 5.0) -> None:
        if size < 1:
            raise ValueError(f"a warm pool holds at least 1 env, got size={size}")
        self.domain, self.size = domain, size
        self._factory, self._executor = factory, executor
        self.prepare_timeout_s, self.backoff_s, self.backoff_max_s = prepare_timeout_s, backoff_s, backoff_max_s
        self._ready: deque[AsyncEnv] = deque()
        self._refill: asyncio.Task[None] | None = None
        self._closed = False
        self.counts = {"hits": 0, "misses": 0, "prepared": 0, "prepare_failures": 0}

    @property
    def ready(self) -> int:
        return len(self._ready)

    def start(self) -> None:
        """Begin filling (on the running event loop); acquire() calls it too."""
        if not self._closed and (self._refill is None or self._refill.done()) and len(self._ready) < self.size:
            self._refill = asyncio.ensure_future(self._fill())

    async def acquire(self) -> tuple[AsyncEnv, bool]:
        """A prepared env: from the pool (True) or built now (False); the pool refills behind it."""
        if self._closed:
            raise RuntimeError(f"the warm pool of {self.domain!r} is closed")
        if self._ready:
            env = self._ready.popleft()
            self.counts["hits"] += 1
            self.start()
            return env, True
        self.counts["misses"] += 1
        self.start()
        return await self.build(), False

    async def build(self) -> AsyncEnv:
        return await build_prepared(self._factory, self._executor, self.prepare_timeout_s)

    async def _fill(self) -> None:
        failures = 0
        while not self._closed and len(self._ready) < self.size:
            try:
                env = await self.build()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failing prepare: counted, backed off, tried again
                self.counts["prepare_failures"] += 1
                delay = min(self.backoff_s * 2**failures, self.backoff_max_s)
                failures += 1
                log.warning("warm pool %s: prepare failed (%s: %s); next try in %.2fs", self.domain,
                            type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            if self._closed:
                await _close_quietly(env)
                return
            self._ready.append(env)
            self.counts["prepared"] += 1

    async def close(self) -> None:
        """Stop refilling and close every prepared env (idempotent)."""
        self._closed = True
        refill, self._refill = self._refill, None
        if refill is not None and not refill.done():
            refill.cancel()
            await asyncio.gather(refill, return_exceptions=True)
        while self._ready:
            await _close_quietly(self._ready.popleft())


async def build_prepared(factory: EnvFactory, executor: Executor | None, timeout_s: float) -> AsyncEnv:
    """Construct (in the thread pool) and prepare one env, each within `timeout_s`; an env whose
    construction finishes after a cancel or a timeout is closed, not leaked."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(executor, factory)
    try:
        raw = await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except BaseException:
        def close_late(done: asyncio.Future[Any]) -> None:  # runs on the loop's thread
            if not done.cancelled() and done.exception() is None:
                asyncio.ensure_future(_close_quietly(AsyncEnv(done.result(), executor)))

        future.add_done_callback(close_late)
        raise
    env = AsyncEnv(raw, executor)
    try:
        await asyncio.wait_for(env.prepare(), timeout_s)
    except BaseException:
        await _close_quietly(env)
        raise
    return env


async def _close_quietly(env: AsyncEnv) -> None:
    try:
        await asyncio.wait_for(env.close(), 10.0)
    except Exception as exc:  # closing is best effort here; the env's own close bounds its cleanup
        log.warning("warm pool: closing an env failed: %s: %s", type(exc).__name__, exc)
