"""`SimEngine`: one simulated inference engine (a tensor-parallel group of GPUs) behind the worker protocol.

In: an `EngineCost` (the model on `tp` GPUs of one kind) and the twin's `WeightChannel`. Calls, the ones
`LLMProxy` makes of an `InferenceWorker` (through `LocalHandle`, so `engine.generate.remote(request)` works
as on a Ray actor): `generate(request)`, `abort(trajectory_id)`, `preempt(trajectory_id)`, `update_weights(version)`, `ready()`,
`stats()`. Out: one `GenerationResult` per request, returned at the virtual time the engine would finish
it, with `max_new_tokens` tokens (the twin's episodes fix their lengths in advance), O(1)-memory token
sequences (`Runs`) and a policy version per token.

The model (continuous batching, as vLLM): requests wait FIFO until a decode slot (`max_batch`) and KV room
for their whole length are free; a newcomer's prefill (only the tokens its trajectory has not cached on
this engine: sticky routing's prefix reuse, an LRU of trajectories' contexts) stalls decoding for its
compute time; then every running request gains one token per decode step, whose time depends on the batch
and its KV (costs.py). A weight update stalls the engine for the pull it still waits for and the swap, then
re-prefills every running request's KV (step 5); their later tokens carry the new version.

Time is fluid and event-driven: the engine counts decode steps as a float `tick` that advances at the
current step time between events (an arrival, a finish, an abort, an update), and a request admitted at
tick a with n tokens ends at tick a + n — a heap of those ends gives the next event in O(log n), so an
engine with hundreds of requests costs a few heap operations per request, not one event per token.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from rollart.sim.costs import EngineCost
from rollart.sim.tokens import Runs
from rollart.types import GenerationRequest, GenerationResult

_EPS = 1e-9


@dataclass(eq=False)
class _Request:
    request: GenerationRequest
    context: int
    new_tokens: int
    prefill: int
    future: asyncio.Future
    start_tick: float = 0.0
    end_tick: float = 0.0
    segments: list[tuple[int, float]] = field(default_factory=list)  # (version, tick it began at)
    done: bool = False


class LocalHandle:
    """Makes a plain object look like a Ray actor handle: `handle.method.remote(*args)` calls
    `obj.method(*args)` (a coroutine for async methods), so production code written for actors (the
    LLM proxy's worker calls) runs on in-process objects unchanged."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        method = _Method(getattr(self._obj, name))
        setattr(self, name, method)  # found directly from now on
        return method


class _Method:
    __slots__ = ("remote",)

    def __init__(self, fn: Any) -> None:
        self.remote = fn


class SimEngine:
    def __init__(self, name: str, cost: EngineCost, weights: Any, index: int, version: int = 0) -> None:
        self.name, self.cost, self.weights, self.index = name, cost, weights, index
        self.version = version
        self.kv_capacity = cost.kv_capacity_tokens()
        self.max_batch = cost.eff.max_batch
        self.cache_capacity = int(self.kv_capacity * cost.eff.prefix_cache_share)
        self._cache: OrderedDict[str, int] = OrderedDict()  # trajectory → tokens of its context cached here
        self._cached = 0
        self._waiting: deque[_Request] = deque()
        self._running: dict[str, _Request] = {}  # by trajectory id (one request per trajectory at a time)
        self._ends: list[tuple[float, int, _Request]] = []
        self._seq = itertools.count()
        self.tick = 0.0
        self._last = 0.0
        self._stall_until = 0.0
        self._step_s = 0.0
        self.batch = 0  # requests decoding (admitted, not released): len(_running) - len(_waiting)
        self._kv_reserved = 0  # whole lengths of running requests (admission)
        self._ctx_sum = 0  # Σ context of running requests
        self._start_sum = 0.0  # Σ start tick of running requests
        self._timer: asyncio.TimerHandle | None = None
        self._plan: tuple[float, float] | None = None  # (when, tick) of the next request's end
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set at the first call
        self.counts = {"requests": 0, "prompt_tokens": 0, "prefill_tokens": 0, "generated": 0, "aborted": 0,
                       "recompute_tokens": 0}
        self.busy_s = 0.0
        self.started_at: float | None = None

    # --- the worker protocol -------------------------------------------------------------------------
    async def ready(self) -> str:
        return self.name

    def generate(self, request: GenerationRequest) -> asyncio.Future[GenerationResult]:
        """Queue `request`; the returned future (awaitable like the actor method's result) resolves with
        its result. A future rather than a coroutine: awaiting it costs the proxy no extra task."""
        loop = self._loop = asyncio.get_running_loop()
        if self.started_at is None:
            self.started_at = loop.time()
        trajectory_id = request.trajectory_id
        if trajectory_id in self._running:
            raise ValueError(f"{self.name}: trajectory {trajectory_id} already has a request running")
        context = len(request.prompt_token_ids)
        cached = min(self._cache.pop(trajectory_id, 0), context)
        self._cached -= cached if cached else 0
        req = _Request(request, context, request.sampling.max_new_tokens, context - cached, loop.create_future())
        self._running[trajectory_id] = req  # (waiting or decoding: abort finds it here)
        self._waiting.append(req)
        self.counts["requests"] += 1
        self.counts["prompt_tokens"] += context
        self.counts["prefill_tokens"] += req.prefill
        self._pump()
        return req.future

    async def preempt(self, trajectory_id: str) -> None:
        """The proxy moves the trajectory's turn elsewhere: as `abort` (neither remembers the trajectory)."""
        await self.abort(trajectory_id)

    async def abort(self, trajectory_id: str) -> None:
        req = self._running.get(trajectory_id)
        if req is None:
            return
        self._advance()
        generated = 0
        if req in self._waiting:
            self._waiting.remove(req)
        else:
            generated = min(req.new_tokens, int(self.tick - req.start_tick + _EPS))
            self._release(req)
        self.counts["aborted"] += 1
        self._finish(req, generated, "abort")
        self._pump()

    async def update_weights(self, version: int) -> dict[str, float]:
        if version <= self.version:
            return {}
        loop = self._loop = asyncio.get_running_loop()
        self._advance()
        wait, pull_s = self.weights.pull_wait(version, self.index, loop.time())
        swap = self.weights.swap_s
        self._stall(wait + swap)
        self._schedule()
        await asyncio.sleep(wait + swap)
        self._advance()
        self.version = version
        decoding = [r for r in self._running.values() if not r.done and r not in self._waiting]
        for req in decoding:
            req.segments.append((version, self.tick))
        kv = self._ctx_sum + len(decoding) * self.tick - self._start_sum
        if kv > 0:  # step 5: in-flight requests' KV recomputed under the new weights
            self._stall(self.cost.prefill_s(int(kv)))
            self.counts["recompute_tokens"] += int(kv)
        self._pump()
        return {"pull_s": pull_s, "exposed_s": wait + swap}

    async def stats(self) -> dict[str, Any]:
        return {"worker": self.name, "version": self.version, "running": self.batch,
                "waiting": len(self._waiting), "busy_s": self.busy_s, **self.counts}

    async def in_flight(self) -> int:
        return len(self._running)

    # --- the fluid model -------------------------------------------------------------------------------
    def _advance(self) -> None:
        """Bring `tick` up to now at the step time in force since the last event."""
        now = self._loop.time()
        start = max(self._last, self._stall_until)
        if now > start and self.batch > 0 and self._step_s > 0:
            self.tick += (now - start) / self._step_s
            self.busy_s += now - start
        self._last = now

    def _stall(self, seconds: float) -> None:
        """Decoding stops for `seconds` (a prefill, a swap, a KV recompute) from now or the current stall
        (the caller plans the next end again: `_schedule`, or `_pump`, which ends with it)."""
        now = self._loop.time()
        begin = max(now, self._stall_until)
        self._stall_until = begin + seconds
        self.busy_s += seconds

    def _kv_live(self) -> float:
        return self._ctx_sum + self.batch * self.tick - self._start_sum

    def _pump(self) -> None:
        """Advance, finish what is done, admit what fits, and set the timer for the next end."""
        self._advance()
        while self._ends and self._ends[0][0] <= self.tick + _EPS:
            _, _, req = heapq.heappop(self._ends)
            if not req.done:
                self._release(req)
                self._finish(req, req.new_tokens, "stop")
        while self._waiting and self.batch < self.max_batch:
            req = self._waiting[0]
            need = req.context + req.new_tokens
            if self.batch > 0 and self._kv_reserved + need > self.kv_capacity:
                break  # (a request longer than the whole KV still runs alone, as a preempting engine would)
            self._waiting.popleft()
            self._admit(req, need)
        self._step_s = self.cost.decode_step_s(self.batch, self._kv_live()) if self.batch else 0.0
        self._schedule()

    def _schedule(self) -> None:
        """Plan the next request's end at the current step time and stall. The timer is moved only when
        the end comes earlier than it is set for; a timer that fires before the end planned since is set
        again for it (fewer cancelled timers for the event loop's heap to carry), without being an event of
        the model: the step time changes at arrivals, ends, aborts and updates only."""
        if not self._ends:
            self._plan = None
            return
        target = self._ends[0][0]
        when = max(self._loop.time(), self._stall_until) + max(0.0, target - self.tick) * self._step_s
        self._plan = (when, target)
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        plan, now = self._plan, self._loop.time()
        if plan is not None and plan[0] > now + _EPS:
            # Set for an end that has moved later since (a newcomer's prefill stall, a slower step): no event
            # of the model happens now, so the timer only moves to the end as planned now.
            self._timer = self._loop.call_at(plan[0], self._on_timer)
            return
        self._advance()
        # Due: the planned end is reached. Snapping to it keeps float rounding from re-arming the timer at
        # the same instant forever (the plan is redone on every change of rate or stall).
        if plan is not None:
            self.tick = max(self.tick, plan[1])
        self._pump()

    def _admit(self, req: _Request, need: int) -> None:
        if req.prefill:
            self._stall(self.cost.prefill_s(req.prefill, req.context - req.prefill))
        req.start_tick = self.tick
        req.end_tick = self.tick + req.new_tokens
        req.segments.append((self.version, self.tick))
        self.batch += 1
        self._kv_reserved += need
        self._ctx_sum += req.context
        self._start_sum += req.start_tick
        heapq.heappush(self._ends, (req.end_tick, next(self._seq), req))

    def _release(self, req: _Request) -> None:
        self.batch -= 1
        self._kv_reserved -= req.context + req.new_tokens
        self._ctx_sum -= req.context
        self._start_sum -= req.start_tick

    def _finish(self, req: _Request, generated: int, reason: str) -> None:
        req.done = True
        trajectory_id = req.request.trajectory_id
        self._running.pop(trajectory_id, None)
        self.counts["generated"] += generated
        self._remember(trajectory_id, req.context + generated)
        if len(req.segments) == 1:
            versions = Runs.shared(req.segments[0][0], generated)
        else:
            versions = self._split_versions(req, generated)
        if not req.future.done():
            req.future.set_result(GenerationResult(
                request_id=req.request.request_id, trajectory_id=trajectory_id, token_ids=Runs.shared(0, generated),
                logprobs=Runs.shared(0.0, generated), versions=versions, finish_reason=reason,
                prompt_tokens=req.context, prefill_tokens=req.prefill, worker=self.name,
            ))

    @staticmethod
    def _split_versions(req: _Request, generated: int) -> Runs:
        """The versions of a request's tokens when weight updates fell inside it."""
        versions = []
        for i, (version, begin) in enumerate(req.segments):
            end = req.segments[i + 1][1] if i + 1 < len(req.segments) else req.start_tick + generated
            versions.append((version, int(round(min(end, req.start_tick + generated) - begin))))
        counted = sum(n for _, n in versions)
        if versions and counted != generated:  # rounding: the last segment takes the difference
            versions[-1] = (versions[-1][0], versions[-1][1] + generated - counted)
        return Runs(tuple(versions))

    def _remember(self, trajectory_id: str, tokens: int) -> None:
        """Keep the trajectory's context cached for its next turn (LRU within the cache's share of KV)."""
        if tokens > self.cache_capacity:
            return
        self._cache[trajectory_id] = tokens
        self._cached += tokens
        while self._cached > self.cache_capacity:
            _, evicted = self._cache.popitem(last=False)
            self._cached -= evicted

    def prefix_hit_rate(self) -> float:
        prompt = self.counts["prompt_tokens"]
        return 1.0 - self.counts["prefill_tokens"] / prompt if prompt else 0.0
