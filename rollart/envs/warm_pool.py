"""A warm pool of prepared environments for one domain on one env worker, refilled in the background.

In: the domain's env factory, how many prepared envs to keep (`envs.warm_pool.size`), the thread pool
sync env calls run in, and bounds (prepare timeout, backoff after failures); `expect(seed, count)`: the
forecast of a group to come (the control plane's `UpcomingGroup`, via the env worker). Out:
`acquire(seed)` → (an `AsyncEnv` ready to be reset with `seed`, whether it came from the pool). A reset
that finds no env ready joins one the refill is preparing that no other reset has joined — being staged for its
seed, else any being built (counted in `joined`): it started earlier, so it is ready sooner than a new one, and a
second prepare beside it would only compete for the same CPUs and leave the first unused (a container start
takes ~0.23 s, much of it the engine's CPU). With none in flight (or the one joined failed), a miss builds and
prepares an env on the spot, so a reset never waits on the pool's backoff or on a prepare not yet begun.
Builds are seed-free and an env is bound to a seed only once built (late binding): a build begun for a
forecast group can serve any reset that comes first — a member of another group whose own envs are late —
and the forecast group is staged from whatever env is ready next.

Two depths of "prepared":
- seed-free: the env's constructor and its optional `prepare()` (the SWE domain creates its workspace
  sandbox there); a reset then only seeds it — but seeds it fully (the SWE domain generates its task and
  writes the package: most of a reset on a sandbox that opens in a millisecond).
- staged for a seed: also the env's optional `preload(seed)`, the seed-dependent part of a reset done
  ahead (the SWE domain writes that seed's package into the workspace); `reset(seed)` then finds it done.
  The pool stages envs only for seeds it was told to expect, from envs already built (staging is then
  the `preload` alone), and `acquire(seed)` prefers one staged for that seed (counted in `staged_hits`),
  then a seed-free one, then one being staged for that seed, then one being built (`joined`), then builds
  one (a miss).

Guarantees: at most `size` envs are ready, staged or being prepared at once (bounded memory, bounded
leftovers); refill prepares up to `parallel` envs at once (1 by default: envs that prepare in milliseconds;
more for envs whose prepare waits on something else — a container start, a server — so a group's worth is
ready within one prepare time), after every acquire and every `expect` — once no acquire came for
`QUIET_S` (a group's resets arrive together: the refill does not compete with them) — expected seeds first
(in the order they were announced: a ready env is staged before another is built), with exponential backoff
while prepares keep failing (a failing domain does not spin a CPU); an env staged for a seed that no reset
takes is closed when a newer forecast needs its room (not while that seed's group is resetting: until
`BEGUN_HOLD_S` after its last reset), or at `close()` — every env the pool made is either handed out by
`acquire` or closed, also one whose construction or staging was still running in a thread when the pool
closed. A reset joins at most one prepare and each prepare serves at most one reset; when a joined prepare
fails (or the pool closes) the reset builds its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from concurrent.futures import Executor
from typing import Any

from rollart.envs.protocol import CLOSE_WAITS_FOR_CALL_S, AsyncEnv, EnvFactory, runs_inline

log = logging.getLogger(__name__)

# The refill starts this long after the last acquire: a group's resets come in a burst, and preparing envs
# beside them (Python work that holds the GIL for its 5 ms switch interval) would slow the very resets the
# pool is there to speed up.
QUIET_S = 0.05
# An env staged for a seed whose resets have begun is not given up for a newer forecast for this long after the
# seed's last reset: a group's members are admitted together but reach the pool seconds apart when prepares are
# slow (a container start under load), and the scheduler forecasts the next group as this one is admitted — so
# on a container domain the laggards' staged envs were closed for the next group's, and the laggards built their
# own. Past it, the members still to come are taken as not coming (cancelled before their reset).
BEGUN_HOLD_S = 10.0


class WarmPool:
    def __init__(self, domain: str, factory: EnvFactory, size: int, *, executor: Executor | None = None,
                 prepare_timeout_s: float = 60.0, backoff_s: float = 0.2, backoff_max_s: float = 5.0,
                 quiet_s: float = QUIET_S, parallel: int = 1, begun_hold_s: float = BEGUN_HOLD_S) -> None:
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
        # resets waiting on a prepare in flight, by the seed it stages (None: seed-free); each gets the env, or
        # None (build your own) when the prepare failed or the pool closed
        self._joined: dict[int | None, deque[asyncio.Future[AsyncEnv | None]]] = {}
        self.quiet_s, self._last_acquire = quiet_s, float("-inf")
        self.begun_hold_s = begun_hold_s
        self._begun: OrderedDict[int, float] = OrderedDict()  # seed → its last acquire (loop time), oldest first
        self._refills: list[asyncio.Task[None]] = []
        self._closed = False
        self.counts = {"hits": 0, "staged_hits": 0, "misses": 0, "prepared": 0, "staged": 0, "staged_unused": 0,
                       "prepare_failures": 0, "joined": 0}

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
        in all (a newer forecast beyond that replaces the oldest — but not a group whose resets have begun: its
        members still to come are staged first)."""
        if self._closed or count < 1:
            return
        to_stage = min(count, self.size) - len(self._staged.get(seed, ()))
        if to_stage > self._expected.get(seed, 0):  # more than was expected: it becomes the newest forecast
            self._expected.pop(seed, None)
            self._expected[seed] = to_stage
        # (told again with no more to stage: the forecast stands as it was, in its place)
        self._forget_begun()
        while sum(self._expected.values()) > self.size:  # forecasts nobody acted on: the oldest go first
            oldest = next((s for s in self._expected if s not in self._begun), None)
            if oldest is None:  # only groups resetting now: the refill stages them first, room permitting
                break
            self._expected[oldest] -= 1
            if self._expected[oldest] <= 0:
                del self._expected[oldest]
        self.start()

    async def acquire(self, seed: int | None = None) -> tuple[AsyncEnv, bool]:
        """A prepared env for a reset with `seed`: staged for it or seed-free from the pool, or the one of a
        prepare in flight that it joins (True), or built now (False); the pool refills behind it."""
        if self._closed:
            raise RuntimeError(f"the warm pool of {self.domain!r} is closed")
        self._last_acquire = asyncio.get_running_loop().time()
        if seed is not None:
            self._forget_begun()
            self._begun[seed] = self._last_acquire
            self._begun.move_to_end(seed)
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
        joined = await self._join(seed)
        if joined is not None:
            self.counts["joined"] += 1
            return joined, True
        self.counts["misses"] += 1
        self.start()
        return await self.build(), False

    async def _join(self, seed: int | None) -> AsyncEnv | None:
        """The env of a prepare in flight that no other reset joined (staged for `seed`, else seed-free), once
        it is ready; None when there is none, or it failed."""
        key: int | None
        if seed is not None and self._staging.get(seed, 0) > self._waiting(seed):
            key = seed
        elif self._preparing - sum(self._staging.values()) > self._waiting(None):
            key = None
        else:
            return None
        waiter: asyncio.Future[AsyncEnv | None] = asyncio.get_running_loop().create_future()
        self._joined.setdefault(key, deque()).append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:  # handed an env as this reset was cancelled (a run ending): close, not leak
            if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                await asyncio.shield(_close_quietly(waiter.result()))
            raise

    def _waiting(self, key: int | None) -> int:
        return sum(not waiter.done() for waiter in self._joined.get(key, ()))

    def _hand_over(self, env: AsyncEnv, seed: int | None) -> bool:
        """Give a just-prepared env to the reset waiting longest on a prepare of its kind, if any."""
        waiters = self._joined.get(seed)
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # (a cancelled reset's waiter is done)
                waiter.set_result(env)
                return True
        self._joined.pop(seed, None)
        return False

    def _release_unbacked(self) -> None:
        """Wake, to build their own, the resets waiting on more prepares than are in flight (one failed)."""
        for key in list(self._joined):
            in_flight = (self._staging.get(key, 0) if key is not None
                         else self._preparing - sum(self._staging.values()))
            waiters = deque(w for w in self._joined[key] if not w.done())
            while len(waiters) > in_flight:
                waiters.pop().set_result(None)
            if waiters:
                self._joined[key] = waiters
            else:
                del self._joined[key]

    async def build(self) -> AsyncEnv:
        return await build_prepared(self._factory, self._executor, self.prepare_timeout_s)

    def _held(self) -> int:
        return self.ready + self._preparing

    def _next_seed(self) -> int | None:
        """The oldest expected seed with envs still to stage beyond those being staged for it now."""
        return next((seed for seed, count in self._expected.items() if count > self._staging.get(seed, 0)), None)

    def _work(self) -> bool:
        """Whether the refill has something to do: a ready env to stage for an expected seed, room for an env to
        build, or — the forecasts wanting more envs than are ready or being built — an env staged for an older
        forecast to replace."""
        if self._preparing >= self.parallel:
            return False
        seed = self._next_seed()
        if seed is not None and self._ready:
            return True
        if self._held() < self.size:
            return True
        return seed is not None and self._short() > 0 and self._replaceable(seed) is not None

    def _building(self) -> int:
        """Envs being built now (seed-free until built)."""
        return self._preparing - sum(self._staging.values())

    def _short(self) -> int:
        """Envs the forecasts want staged beyond those being staged, ready or being built now."""
        wanted = sum(max(0, count - self._staging.get(seed, 0)) for seed, count in self._expected.items())
        return wanted - len(self._ready) - self._building()

    def _replaceable(self, seed: int) -> int | None:
        """The oldest seed other than `seed` with an env staged for it, whose group is not resetting now."""
        self._forget_begun()
        return next((other for other in self._staged if other != seed and other not in self._begun), None)

    def _forget_begun(self) -> None:
        """Forget the seeds whose last reset is older than `begun_hold_s` (bounded: one entry per recent seed)."""
        held_until = asyncio.get_running_loop().time() - self.begun_hold_s
        while self._begun and next(iter(self._begun.values())) < held_until:  # (oldest acquire first)
            self._begun.popitem(last=False)

    async def _fill(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while not self._closed and self._work():
            quiet = self._last_acquire + self.quiet_s - loop.time()
            if quiet > 0:  # resets are still coming in: prepare once they have passed
                await asyncio.sleep(quiet)
                continue
            self._preparing += 1
            failed: Exception | None = None
            try:
                seed = self._next_seed()
                if seed is not None and self._ready:
                    await self._stage_next(seed, self._ready.popleft())
                else:
                    if self._held() > self.size and seed is not None:  # (this build counts in _preparing already)
                        await self._give_up_staged(seed)
                    await self._keep(await self.build(), None)  # bound to a seed once built, not before
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed = exc
            finally:
                self._preparing -= 1
                self._release_unbacked()  # a reset that joined a failed prepare builds its own now, not after backoff
            if failed is not None:  # a failing prepare: counted, backed off, tried again
                self.counts["prepare_failures"] += 1
                delay = min(self.backoff_s * 2**failures, self.backoff_max_s)
                failures += 1
                log.warning("warm pool %s: prepare failed (%s: %s); next try in %.2fs", self.domain,
                            type(failed).__name__, failed, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0

    async def _stage_next(self, seed: int, env: AsyncEnv) -> None:
        """Stage a built env for `seed` (the oldest expected one with envs still to stage)."""
        self._staging[seed] = self._staging.get(seed, 0) + 1
        try:
            try:
                await asyncio.wait_for(env.preload(seed), self.prepare_timeout_s)
            except BaseException:
                await _close_quietly(env)
                raise
            await self._keep(env, seed)
        finally:
            self._staging[seed] -= 1
            if not self._staging[seed]:
                del self._staging[seed]

    async def _give_up_staged(self, seed: int) -> None:
        """Make room for an env the forecast of `seed` needs: close the env staged longest for another, older
        forecast whose group is not resetting now."""
        other = self._replaceable(seed)
        if other is None:
            return
        stale = self._staged[other].popleft()
        if not self._staged[other]:
            del self._staged[other]
        self.counts["staged_unused"] += 1
        await _close_quietly(stale)

    async def _keep(self, env: AsyncEnv, seed: int | None) -> None:
        """Hold a prepared env (staged for `seed`, or seed-free) — or close it: the pool closed meanwhile, or
        every reset forecast for its seed came while it was being staged (nobody will ask for it)."""
        if self._closed:
            await _close_quietly(env)
        elif self._hand_over(env, seed):  # a reset joined this prepare (it is no longer expected: acquire counted it)
            pass
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
        for waiters in self._joined.values():  # resets waiting on a prepare build their own
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._joined.clear()
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
    construction finishes after a cancel or a timeout is closed, not leaked. A factory of a class that
    `runs_inline` constructs on the loop (protocol.py)."""
    if runs_inline(factory):
        raw = factory()
    else:
        raw = await _construct(factory, executor, timeout_s)
    env = AsyncEnv(raw, executor)
    try:
        async with asyncio.timeout(timeout_s):  # (not wait_for: no extra task per env built)
            await env.prepare()
    except BaseException:
        await _close_quietly(env)
        raise
    return env


async def _construct(factory: EnvFactory, executor: Executor | None, timeout_s: float) -> Any:
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(executor, factory)
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except BaseException:
        def close_late(done: asyncio.Future[Any]) -> None:  # runs on the loop's thread
            if not done.cancelled() and done.exception() is None:
                asyncio.ensure_future(_close_quietly(AsyncEnv(done.result(), executor)))

        future.add_done_callback(close_late)
        raise


async def _close_quietly(env: AsyncEnv) -> None:
    try:  # close waits for a prepare still in its thread (AsyncEnv.close), so its bound is above that wait's
        await asyncio.wait_for(env.close(), CLOSE_WAITS_FOR_CALL_S + 10.0)
    except Exception as exc:  # closing is best effort here; the env's own close bounds its cleanup
        log.warning("warm pool: closing an env failed: %s: %s", type(exc).__name__, exc)
