"""A warm pool of prepared environments for one domain on one env worker, refilled in the background.

In: the domain's env factory, how many prepared envs to keep (`envs.warm_pool.size`), the thread pool
sync env calls run in, and bounds (prepare timeout, backoff after failures); `expect(seed, count)`: the
forecast of a group to come (the control plane's `UpcomingGroup`, via the env worker). Out:
`acquire(seed)` → (an `AsyncEnv` ready to be reset with `seed`, whether it came from the pool). A miss
(pool empty) builds and prepares an env on the spot, so a reset never waits on the pool's refill.

Two depths of "prepared":
- seed-free: the env's constructor and its optional `prepare()` (the SWE domain creates its workspace
  sandbox there); a reset then only seeds it — but seeds it fully (the SWE domain generates its task and
  writes the package: most of a reset on a sandbox that opens in a millisecond).
- staged for a seed: also the env's optional `preload(seed)`, the seed-dependent part of a reset done
  ahead (the SWE domain writes that seed's package into the workspace); `reset(seed)` then finds it done.
  The pool stages envs only for seeds it was told to expect, and `acquire(seed)` prefers one staged for
  that seed (counted in `staged_hits`), then a seed-free one, then builds one (a miss).

Guarantees: at most `size` envs are ready, staged or being prepared at once (bounded memory, bounded
leftovers); refill prepares up to `parallel` envs at once (1 by default: envs that prepare in milliseconds;
more for envs whose prepare waits on something else — a container start, a server — so a group's worth is
ready within one prepare time), after every acquire and every `expect` — once no acquire came for
`QUIET_S` (a group's resets arrive together: the refill does not compete with them) — expected seeds first
(in the order they were announced), with exponential backoff while prepares keep failing (a failing domain does
not spin a CPU); an env staged for a seed that no reset takes is closed when a newer forecast needs its
room, or at `close()` — every env the pool made is either handed out by `acquire` or closed, also one
whose construction or staging was still running in a thread when the pool closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from concurrent.futures import Executor
from typing import Any

from rollart.envs.protocol import AsyncEnv, EnvFactory

log = logging.getLogger(__name__)

# The refill starts this long after the last acquire: a group's resets come in a burst, and preparing envs
# beside them (Python work that holds the GIL for its 5 ms switch interval) would slow the very resets the
# pool is there to speed up.
QUIET_S = 0.05


class WarmPool:
    def __init__(self, domain: str, factory: EnvFactory, size: int, *, executor: Executor | None = None,
                 prepare_timeout_s: float = 60.0, backoff_s: float = 0.2, backoff_max_s: float = 5.0,
                 quiet_s: float = QUIET_S, parallel: int = 1) -> None:
        if size < 1:
            raise ValueError(f"a warm pool holds at least 1 env, got size={size}")
        if parallel < 1:
            raise ValueError(f"a warm pool prepares at least 1 env at a time, got parallel={parallel}")
        self.domain, self.size, self.parallel = domain, size, parallel
        self._factory, self._executor = factory, executor
        self.prepare_timeout_s, self.backoff_s, self.backoff_max_s = prepare_timeout_s, backoff_s, backoff_max_s
        self._ready: deque[AsyncEnv] = deque()  # prepared, seed-free
        self._staged: OrderedDict[int, deque[AsyncEnv]] = OrderedDict()  # seed → envs staged for it, oldest first
        self._expected: OrderedDict[int, int] = OrderedDict()  # seed → envs still to stage for it, oldest first
        self._staging: dict[int, int] = {}  # seed → envs being staged for it now
        self._preparing = 0  # envs being built or staged by the refill (at most `parallel`)
        self.quiet_s, self._last_acquire = quiet_s, float("-inf")
        self._refills: list[asyncio.Task[None]] = []
        self._closed = False
        self.counts = {"hits": 0, "staged_hits": 0, "misses": 0, "prepared": 0, "staged": 0, "staged_unused": 0,
                       "prepare_failures": 0}

    @property
    def ready(self) -> int:
        """Envs held ready (seed-free or staged)."""
        return len(self._ready) + self.staged

    @property
    def staged(self) -> int:
        return sum(len(envs) for envs in self._staged.values())

    def start(self) -> None:
        """Begin filling (on the running event loop); acquire() and expect() call it too."""
        self._refills = [task for task in self._refills if not task.done()]
        while not self._closed and len(self._refills) < self.parallel and self._work():
            self._refills.append(asyncio.ensure_future(self._fill()))

    def expect(self, seed: int, count: int) -> None:
        """`count` resets with `seed` are forecast (a group to come): stage envs for them ahead, at most `size`
        in all (a newer forecast beyond that replaces the oldest)."""
        if self._closed or count < 1:
            return
        have = len(self._staged.get(seed, ())) + self._expected.pop(seed, 0)
        if have < count:
            self._expected[seed] = min(count, self.size) - len(self._staged.get(seed, ()))
        while sum(self._expected.values()) > self.size:  # forecasts nobody acted on: the oldest go first
            oldest = next(iter(self._expected))
            self._expected[oldest] -= 1
            if self._expected[oldest] <= 0:
                del self._expected[oldest]
        self.start()

    async def acquire(self, seed: int | None = None) -> tuple[AsyncEnv, bool]:
        """A prepared env for a reset with `seed`: staged for it or seed-free from the pool (True), or built
        now (False); the pool refills behind it."""
        if self._closed:
            raise RuntimeError(f"the warm pool of {self.domain!r} is closed")
        self._last_acquire = asyncio.get_running_loop().time()
        staged = self._staged.get(seed) if seed is not None else None
        if staged:
            env = staged.popleft()
            if not staged:
                del self._staged[seed]
            self.counts["hits"] += 1
            self.counts["staged_hits"] += 1
            self.start()
            return env, True
        if seed in self._expected:  # this reset takes another env: one fewer to stage for its seed
            self._expected[seed] -= 1
            if self._expected[seed] <= 0:
                del self._expected[seed]
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

    def _held(self) -> int:
        return self.ready + self._preparing

    def _next_seed(self) -> int | None:
        """The oldest expected seed with envs still to stage beyond those being staged for it now."""
        return next((seed for seed, count in self._expected.items() if count > self._staging.get(seed, 0)), None)

    def _work(self) -> bool:
        """Whether the refill has something to do: an expected seed to stage (with room, a seed-free env to
        stage, or an env staged for another seed to replace), or room for a seed-free env."""
        if self._preparing >= self.parallel:
            return False
        seed = self._next_seed()
        if seed is not None:
            if self._held() < self.size or self._ready or self._replaceable(seed) is not None:
                return True
        return self._held() < self.size

    def _replaceable(self, seed: int) -> int | None:
        """The oldest seed other than `seed` with an env staged for it."""
        return next((other for other in self._staged if other != seed), None)

    async def _fill(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while not self._closed and self._work():
            quiet = self._last_acquire + self.quiet_s - loop.time()
            if quiet > 0:  # resets are still coming in: prepare once they have passed
                await asyncio.sleep(quiet)
                continue
            self._preparing += 1
            try:
                seed = self._next_seed()
                if seed is not None:
                    await self._stage_next(seed)
                else:
                    await self._keep(await self.build(), None)
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
            finally:
                self._preparing -= 1
            failures = 0

    async def _stage_next(self, seed: int) -> None:
        """Stage one env for `seed` (the oldest expected one): a seed-free env the pool holds, else a new one
        (room made, if need be, by closing the env staged longest for another, older forecast)."""
        self._staging[seed] = self._staging.get(seed, 0) + 1
        try:
            await self._stage(seed)
        finally:
            self._staging[seed] -= 1
            if not self._staging[seed]:
                del self._staging[seed]

    async def _stage(self, seed: int) -> None:
        if self._ready:
            env = self._ready.popleft()
        else:
            other = self._replaceable(seed)
            if self._held() > self.size and other is not None:  # (this env counts in _preparing already)
                stale = self._staged[other].popleft()
                if not self._staged[other]:
                    del self._staged[other]
                self.counts["staged_unused"] += 1
                await _close_quietly(stale)
            env = await self.build()
        try:
            await asyncio.wait_for(env.preload(seed), self.prepare_timeout_s)
        except BaseException:
            await _close_quietly(env)
            raise
        await self._keep(env, seed)

    async def _keep(self, env: AsyncEnv, seed: int | None) -> None:
        """Hold a prepared env (staged for `seed`, or seed-free) — or close it: the pool closed meanwhile, or
        every reset forecast for its seed came while it was being staged (nobody will ask for it)."""
        if self._closed:
            await _close_quietly(env)
        elif seed is None:
            self._ready.append(env)
            self.counts["prepared"] += 1
        elif seed not in self._expected:
            self.counts["staged_unused"] += 1
            await _close_quietly(env)
        else:
            self._expected[seed] -= 1
            if self._expected[seed] <= 0:
                del self._expected[seed]
            self._staged.setdefault(seed, deque()).append(env)
            self.counts["staged"] += 1

    async def close(self) -> None:
        """Stop refilling and close every prepared env (idempotent)."""
        self._closed = True
        refills, self._refills = self._refills, []
        for refill in refills:
            refill.cancel()
        await asyncio.gather(*refills, return_exceptions=True)
        envs = [*self._ready, *(env for staged in self._staged.values() for env in staged)]
        self._ready.clear()
        self._staged.clear()
        self._expected.clear()
        for env in envs:
            await _close_quietly(env)


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
