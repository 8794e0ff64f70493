"""`LLMProxy`, the one entry to generation for environment managers.

In: the inference workers of each pool (`{pool: [InferenceWorker actor handles]}`), the domain → pool
mapping (`{domain: domains.<domain>.pool}`) and each pool's fallback pools, from the driver; later, workers
that join (`add_worker`) and leave (`remove_worker`) as the resource plane replaces and grows clusters.
Calls: `generate`, `abort(trajectory_id)`, `suspend`/`resume`, `update_weights(version)`, `remap(domain_pools)`,
`in_flight`,
`stats`; and `submit(channel, items)` + `take(channel)`, the batched form of `generate` env workers use (many
requests per message, each result handed back with the first `take` after it exists: `rollart.base.batched_calls`).
Out: each request's `GenerationResult`, from the worker `rollart.inference.router.Router` chose. Requests go to a
worker the same batched way when it offers `submit`/`take` (an `InferenceWorker` does), one call each otherwise.

Guarantees:
- Routing follows the config: a request generates on its domain's pool's cluster (or, while that pool has
  no worker, on the first of its fallback pools that has one), sticky per trajectory, least-loaded for a
  new trajectory (see router.py).
- `suspend()` admits nothing new: a request that arrives while suspended waits for `resume()` (at most
  `inference.admission_timeout_s`, then TimeoutError naming it); requests already admitted keep running.
- `abort(trajectory_id)` ends the trajectory's running and waiting requests (their callers get
  `finish_reason="abort"` with the tokens so far) and every later request of it returns aborted at once.
- Every wait on a worker is bounded (`inference.request_timeout_s` plus a margin; the turns in flight share one
  timer, base/deadlines.py).
- A worker that dies leaves the routing at once (the first call that fails on it, or `remove_worker`), and
  each request it held is sent again — same prompt token ids, same sampling seed — to another worker of the
  pool or its fallback (at most `inference.turn_retries` times per request; counted in `turn_retries`):
  only the unfinished turn is generated again, the trajectory's earlier turns are untouched. With no
  worker left to take it, a request waits for one to join (at most `inference.admission_timeout_s`).
- A worker that joins takes no request before it serves the version the others serve (it pulls it from the
  weight store first); `update_weights` and joins are serialised, so no worker is left a version behind.
- Lendable pools (`lendable`: the trainer's devices running an engine on the trainer's own weights while it
  waits for a batch — `train.elastic_generation`) take requests only between `lend(pool)` and
  `reclaim(pool)` (routing: router.py) and are never asked to update weights. `reclaim` aborts what runs
  there; each such turn goes on at once on a worker of its domain's pool from the tokens it has — its
  context plus those tokens as the prompt, the rest of its token budget — and its caller gets one result,
  the tokens of both parts with their versions (counted: `preempted_turns`, `preempted_tokens`).
  `rebalance(pool)`, once a loan has begun, moves turns the same way from the busiest workers to the lent
  ones until the requests in flight are level.

Run it as a Ray async actor, e.g. `ray.remote(LLMProxy).options(num_cpus=0).remote(workers, domain_pools,
cfg.inference)`, and hand env workers its handle (they wrap it in `rollart.envs.ActorLLMClient`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from rollart.base.batched_calls import CallBatcher, Outbox, Outcome
from rollart.base.deadlines import Deadlines
from rollart.config import InferenceConfig
from rollart.inference.results import aborted_result
from rollart.inference.router import Router, WorkerKey
from rollart.resources.health import death_cause, gather_alive, is_worker_death
from rollart.types import GenerationRequest, GenerationResult

log = logging.getLogger("rollart.inference")

_REMEMBERED_ABORTS = 65536
_WORKER_CALL_MARGIN_S = 30.0  # a worker's own request timeout fires first; this guards a hung worker
TAKE_WAIT_S = 30.0  # how long one `take` waits for a result before it answers [] (the env worker asks again)


class LLMProxy:
    def __init__(
        self,
        workers: Mapping[str, Sequence[Any]],
        domain_pools: Mapping[str, str],
        cfg: InferenceConfig | None = None,
        pool_fallbacks: Mapping[str, Sequence[str]] | None = None,
        lendable: Sequence[str] = (),
    ) -> None:
        cfg = cfg or InferenceConfig()
        self._workers = {pool: list(handles) for pool, handles in workers.items()}  # by key index
        self._router = Router({p: len(h) for p, h in self._workers.items()}, domain_pools,
                              max_sticky=cfg.sticky_trajectories, pool_fallbacks=pool_fallbacks, lendable=lendable)
        self._lendable = frozenset(lendable)
        self._running: dict[WorkerKey, set[str]] = {}  # trajectories with a request on each worker now
        self._moving: set[str] = set()  # trajectories whose request is being aborted to go on elsewhere
        self._preempted_turns = 0
        self._preempted_tokens = 0
        self._admission_timeout_s = cfg.admission_timeout_s
        self._call_timeout_s = cfg.request_timeout_s + _WORKER_CALL_MARGIN_S
        self._call_deadlines = Deadlines(self._call_timeout_s)
        self._max_retries = cfg.turn_retries
        self._suspended = False
        self._cond = asyncio.Condition()  # admission (resume, aborts) and membership (a worker joined)
        self._membership = asyncio.Lock()  # weight updates and joins, one at a time
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self._waiting = 0
        self._routed = 0
        self._routed_by_domain: dict[str, dict[str, int]] = {}  # domain → pool → requests sent there
        self._turn_retries = 0
        self._workers_lost = 0
        self._workers_joined = 0
        self._version = -1  # the version every routed worker serves (-1: not set by update_weights yet)
        self._names: dict[WorkerKey, str] = {}
        self._channel = uuid.uuid4().hex  # this proxy's channel on each worker's outbox
        self._batchers: dict[WorkerKey, CallBatcher | None] = {}  # None: the worker takes one call per request
        self._outbox = Outbox()  # the env workers' batched requests (`submit`/`take`)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        trajectory_id = request.trajectory_id
        if self._suspended and trajectory_id not in self._aborted:
            await self._wait_admitted(request)
        retries = 0
        partial: GenerationResult | None = None  # what a preempted lent worker generated of this turn so far
        while True:
            if trajectory_id in self._aborted:
                return _joined(partial, aborted_result(request)) if partial is not None else aborted_result(request)
            key = self._router.route(request.domain, trajectory_id)
            if key is None:
                await self._wait_for_worker(request)
                continue
            self._router.started(key)
            self._routed += 1
            by_pool = self._routed_by_domain.setdefault(request.domain, {})
            by_pool[key[0]] = by_pool.get(key[0], 0) + 1
            running = self._running.get(key)
            if running is None:
                running = self._running[key] = set()
            running.add(trajectory_id)
            try:
                async with self._call_deadlines.bound():  # (one timer for all turns in flight)
                    result = await self._send(key, request)
                if result.finish_reason != "abort" or trajectory_id not in self._moving:
                    if self._moving:  # (a move that came after this turn had ended is void)
                        self._moving.discard(trajectory_id)
                    return _joined(partial, result) if partial is not None else result
            except TimeoutError:
                raise TimeoutError(
                    f"LLMProxy: worker {self._name(key)} gave no answer for request {request.request_id!r} "
                    f"within {self._call_timeout_s:g} s"
                ) from None
            except Exception as exc:
                if not is_worker_death(exc):
                    raise
                await self._lost(key, death_cause(exc))
                if retries >= self._max_retries:
                    raise RuntimeError(
                        f"LLMProxy: request {request.request_id!r} lost its worker {retries + 1} times "
                        f"(inference.turn_retries={self._max_retries}); last: {self._name(key)} died"
                    ) from exc
                retries += 1
                self._turn_retries += 1
                log.warning("request %s: worker %s died; generating the turn again on another worker",
                            request.request_id, self._name(key))
                continue
            finally:
                self._router.finished(key)
                running.discard(trajectory_id)
            # moved (`reclaim`, `rebalance`): the turn goes on elsewhere from the tokens it has
            self._moving.discard(trajectory_id)
            partial = _joined(partial, result) if partial is not None else result
            if trajectory_id in self._aborted:
                return partial
            self._preempted_turns += 1
            self._preempted_tokens += len(result.token_ids)
            self._router.forget(trajectory_id)
            left = request.sampling.max_new_tokens - len(result.token_ids)
            if left <= 0:
                return replace(partial, finish_reason="length")
            request = replace(request, prompt_token_ids=request.prompt_token_ids + result.token_ids,
                              sampling=replace(request.sampling, max_new_tokens=left))

    async def submit(self, channel: str, items: list[tuple[int, GenerationRequest]]) -> None:
        """`generate` for each (sequence number, request) of an env worker's channel, answered through `take`."""
        self._outbox.start(channel, [(seq, self.generate(request)) for seq, request in items])

    async def take(self, channel: str, wait_s: float = TAKE_WAIT_S) -> list[Outcome]:
        """The outcomes of `channel`'s submitted requests ended since its last `take` (waits for one)."""
        return await self._outbox.take(channel, wait_s)

    def _send(self, key: WorkerKey, request: GenerationRequest) -> Any:
        """The worker's answer to `request`: batched with the other requests sent to it in this loop iteration
        when it offers `submit`/`take`; a worker's death is raised here as a direct call would raise it."""
        if key not in self._batchers:
            handle = self._handle(key)
            self._batchers[key] = (
                CallBatcher(lambda items: handle.submit.remote(self._channel, items),
                            lambda: handle.take.remote(self._channel))
                if hasattr(handle, "submit") and hasattr(handle, "take") else None
            )
        batcher = self._batchers[key]
        return batcher.call(request) if batcher is not None else self._handle(key).generate.remote(request)

    async def _wait_admitted(self, request: GenerationRequest) -> None:
        self._waiting += 1
        try:
            async with self._cond:
                await asyncio.wait_for(
                    self._cond.wait_for(lambda: not self._suspended or request.trajectory_id in self._aborted),
                    self._admission_timeout_s,
                )
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"LLMProxy: request {request.request_id!r} of trajectory {request.trajectory_id!r} waited "
                f"{self._admission_timeout_s:g} s (inference.admission_timeout_s) for resume() after suspend()"
            ) from None
        finally:
            self._waiting -= 1

    async def _wait_for_worker(self, request: GenerationRequest) -> None:
        """No pool the request may use has a worker: wait for one to join (or for an abort)."""
        self._waiting += 1
        try:
            async with self._cond:
                await asyncio.wait_for(self._cond.wait_for(
                    lambda: request.trajectory_id in self._aborted or self._router.can_route(request.domain)
                ), self._admission_timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"LLMProxy: no inference worker for domain {request.domain!r} (its pool and fallbacks) joined "
                f"within {self._admission_timeout_s:g} s (inference.admission_timeout_s); request "
                f"{request.request_id!r} fails"
            ) from None
        finally:
            self._waiting -= 1

    async def abort(self, trajectory_id: str) -> None:
        async with self._cond:
            self._aborted[trajectory_id] = None
            while len(self._aborted) > _REMEMBERED_ABORTS:
                self._aborted.popitem(last=False)
            self._cond.notify_all()
        key = self._router.worker_of(trajectory_id)
        if key is not None:
            try:
                await asyncio.wait_for(self._handle(key).abort.remote(trajectory_id), self._call_timeout_s)
            except Exception as exc:
                if not is_worker_death(exc):
                    raise
                await self._lost(key, death_cause(exc))  # its requests are gone with it: nothing to abort
            self._router.forget(trajectory_id)

    async def remap(self, domain_pools: Mapping[str, str]) -> None:
        """Route new trajectories of these domains to these pools (in-flight ones stay where they are)."""
        self._router.remap(domain_pools)

    def domain_pools(self) -> dict[str, str]:
        """The pool each domain's new trajectories go to now."""
        return dict(self._router.domain_pools)

    async def suspend(self) -> None:
        self._suspended = True

    async def resume(self) -> None:
        async with self._cond:
            self._suspended = False
            self._cond.notify_all()

    async def update_weights(self, version: int) -> dict[str, dict[str, float]]:
        """Every worker serves `version` (pulled from its subscriber); per worker: its swap timings. A worker
        that dies meanwhile leaves the routing (its replacement pulls `version` when it joins). Lent workers
        are not asked: they serve the trainer's own weights, whatever version it holds."""
        async with self._membership:
            keys = [k for k in self._router.in_flight() if k[0] not in self._lendable]
            done = await self._on_alive(keys, lambda w: w.update_weights.remote(version))
            self._version = max(self._version, version)
            await self._learn_names()
            return {self._name(k): r for k, r in done.items()}

    async def lend(self, pool: str) -> None:
        """The lendable pool `pool` (the trainer's devices, serving the trainer's own weights) takes requests."""
        self._router.lend(pool)

    async def reclaim(self, pool: str) -> int:
        """The trainer takes `pool` back: nothing more is routed there, and every request running there is
        aborted — each goes on, from the tokens it has, on a worker of its domain's pool (a new request whose
        prompt is the context plus those tokens; the turn's tokens keep their versions). Returns how many."""
        self._router.reclaim(pool)
        # sorted: a set's order follows the process's string hashing, and the order of the moves is what the
        # twin's runs (and a real run's routing) depend on
        return await self._move({key: sorted(ts) for key, ts in self._running.items() if key[0] == pool and ts})

    async def rebalance(self, pool: str) -> int:
        """The lent pool `pool` has just come up: move turns running on the busiest workers there until the
        requests in flight are level (each goes on, from its tokens so far, on the least loaded worker — a lent
        one). Returns how many moved."""
        lent = [k for k in self._router.in_flight() if k[0] == pool]
        others = [k for k in self._router.in_flight() if k[0] not in self._lendable]
        if not lent or not others:
            return 0
        counts = {k: len(self._running.get(k, ())) for k in others}
        level = sum(counts.values()) // (len(others) + len(lent))
        moves = {k: sorted(self._running[k] - self._moving)[:n - level] for k, n in counts.items() if n > level + 1}
        return await self._move({k: ts for k, ts in moves.items() if ts})

    async def _move(self, turns: dict[WorkerKey, list[str]]) -> int:
        """Preempt these trajectories' running requests so that each goes on elsewhere (see `generate`): unlike
        `abort`, the worker does not refuse their later turns, which may be routed back to it."""
        for ts in turns.values():
            self._moving.update(ts)
        if turns:
            await gather_alive({k: asyncio.gather(*(self._handle(k).preempt.remote(t) for t in ts))
                                for k, ts in turns.items()}, self._call_timeout_s,
                               lambda key, exc: self._lost(key, death_cause(exc)))
        return sum(len(ts) for ts in turns.values())

    async def add_worker(self, pool: str, handle: Any) -> str:
        """A worker joins `pool` (a replacement, or an elastic addition): it pulls the version the others
        serve, then takes requests — a lendable pool's worker (a trainer rank) serves its own weights and is
        routed to only while lent. Returns its name."""
        async with self._membership:
            if self._version >= 0 and pool not in self._lendable:
                await asyncio.wait_for(handle.update_weights.remote(self._version), self._call_timeout_s)
            name = await asyncio.wait_for(handle.ready.remote(), self._call_timeout_s)
            async with self._cond:
                key = self._router.add(pool)
                self._workers.setdefault(pool, []).append(handle)
                self._names[key] = name
                self._workers_joined += 1
                self._cond.notify_all()
        if pool in self._lendable:
            log.info("worker %s joined pool %s (it serves the trainer's own weights while lent)", name, pool)
        else:
            log.info("worker %s joined pool %s at version %d", name, pool, self._version)
        return name

    async def remove_worker(self, actor_id: str, cause: str = "") -> bool:
        """The resource plane found this worker dead: route nothing more to it (False if unknown or gone)."""
        for pool, handles in self._workers.items():
            for index, handle in enumerate(handles):
                key = (pool, index)
                if _actor_id(handle) == actor_id and key in self._router.in_flight():
                    await self._lost(key, cause)
                    return True
        return False

    async def _lost(self, key: WorkerKey, cause: str) -> None:
        if key not in self._router.in_flight():
            return  # already removed (several requests saw the same death)
        self._router.remove(key)
        self._workers_lost += 1
        log.warning("LLMProxy: worker %s left the routing (dead: %s)", self._name(key), cause)

    async def in_flight(self) -> dict[str, int]:
        """Requests in flight per worker name."""
        await self._learn_names()
        return {self._name(k): n for k, n in self._router.in_flight().items()}

    async def stats(self, workers: bool = False) -> dict[str, Any]:
        """Proxy counters; with `workers=True` also each worker's own `stats()`."""
        await self._learn_names()
        out: dict[str, Any] = {
            "suspended": self._suspended,
            "waiting_admission": self._waiting,
            "routed": self._routed,
            "routed_by_domain": {domain: dict(pools) for domain, pools in self._routed_by_domain.items()},
            "turn_retries": self._turn_retries,
            "preempted_turns": self._preempted_turns,
            "preempted_tokens": self._preempted_tokens,
            "workers_lost": self._workers_lost,
            "workers_joined": self._workers_joined,
            "in_flight": {self._name(k): n for k, n in self._router.in_flight().items()},
            "trajectories_assigned": {self._name(k): n for k, n in self._router.assigned().items()},
        }
        if workers:
            values = await self._on_alive(list(self._router.in_flight()), lambda w: w.stats.remote())
            out["workers"] = {self._name(k): v for k, v in values.items()}
        return out

    def _handle(self, key: WorkerKey) -> Any:
        return self._workers[key[0]][key[1]]

    def _name(self, key: WorkerKey) -> str:
        return self._names.get(key, f"{key[0]}[{key[1]}]")

    async def _learn_names(self) -> None:
        missing = [k for k in self._router.in_flight() if k not in self._names]
        if missing:
            self._names.update(await self._on_alive(missing, lambda w: w.ready.remote()))

    async def _on_alive(self, keys: list[WorkerKey], call: Callable[[Any], Any]) -> dict[WorkerKey, Any]:
        """`call(handle)` on the workers of `keys` at once: their results by key; a worker found dead
        leaves the routing (other errors are raised)."""
        return await gather_alive({k: call(self._handle(k)) for k in keys}, self._call_timeout_s,
                                  lambda key, exc: self._lost(key, death_cause(exc)))


def _joined(first: GenerationResult, then: GenerationResult) -> GenerationResult:
    """One turn's result from its part before a preemption and the part after (ids, logprobs, versions in order)."""
    return replace(then, request_id=first.request_id, token_ids=first.token_ids + then.token_ids,
                   logprobs=first.logprobs + then.logprobs, versions=first.versions + then.versions,
                   prompt_tokens=first.prompt_tokens, prefill_tokens=first.prefill_tokens + then.prefill_tokens,
                   spans=first.spans + then.spans)


def _actor_id(handle: Any) -> str:
    actor_id = getattr(handle, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else str(id(handle))

