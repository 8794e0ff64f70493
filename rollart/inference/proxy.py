"""`LLMProxy`, the one entry to generation for environment managers.

In: the inference workers of each pool (`{pool: [InferenceWorker actor handles]}`) and the
domain → pool mapping (`{domain: domains.<domain>.pool}`), both from the driver. Calls: `generate`,
`abort(trajectory_id)`, `suspend`/`resume`, `update_weights_to(version)`, `in_flight`, `stats`.
Out: each request's `GenerationResult`, from the worker `rollart.inference.router.Router` chose.

Guarantees:
- Routing follows the config: a request generates on its domain's pool's cluster, sticky per trajectory,
  least-loaded for a new trajectory (see router.py).
- `suspend()` admits nothing new: a request that arrives while suspended waits for `resume()` (at most
  `inference.admission_timeout_s`, then TimeoutError naming it); requests already admitted keep running.
- `abort(trajectory_id)` ends the trajectory's running and waiting requests (their callers get
  `finish_reason="abort"` with the tokens so far) and every later request of it returns aborted at once.
- Every wait on a worker is bounded (`inference.request_timeout_s` plus a margin).

Run it as a Ray async actor, e.g. `ray.remote(LLMProxy).options(num_cpus=0).remote(workers, domain_pools,
cfg.inference)`, and hand env workers its handle (they wrap it in `rollart.envs.ActorLLMClient`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Mapping, Sequence

from rollart.config import InferenceConfig
from rollart.inference.results import aborted_result
from rollart.inference.router import Router, WorkerKey
from rollart.types import GenerationRequest, GenerationResult

_REMEMBERED_ABORTS = 65536
_WORKER_CALL_MARGIN_S = 30.0  # a worker's own request timeout fires first; this guards a dead worker


class LLMProxy:
    def __init__(
        self,
        workers: Mapping[str, Sequence[Any]],
        domain_pools: Mapping[str, str],
        cfg: InferenceConfig | None = None,
    ) -> None:
        cfg = cfg or InferenceConfig()
        self._workers = {pool: list(handles) for pool, handles in workers.items()}
        self._router = Router({p: len(h) for p, h in self._workers.items()}, domain_pools)
        self._admission_timeout_s = cfg.admission_timeout_s
        self._call_timeout_s = cfg.request_timeout_s + _WORKER_CALL_MARGIN_S
        self._suspended = False
        self._cond = asyncio.Condition()
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self._waiting = 0
        self._routed = 0
        self._names: dict[WorkerKey, str] = {}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        trajectory_id = request.trajectory_id
        if self._suspended and trajectory_id not in self._aborted:
            await self._wait_admitted(request)
        if trajectory_id in self._aborted:
            return aborted_result(request)
        key = self._router.route(request.domain, trajectory_id)
        self._router.started(key)
        self._routed += 1
        try:
            return await asyncio.wait_for(self._handle(key).generate.remote(request), self._call_timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"LLMProxy: worker {self._name(key)} gave no answer for request {request.request_id!r} within "
                f"{self._call_timeout_s:g} s"
            ) from None
        finally:
            self._router.finished(key)

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

    async def abort(self, trajectory_id: str) -> None:
        async with self._cond:
            self._aborted[trajectory_id] = None
            while len(self._aborted) > _REMEMBERED_ABORTS:
                self._aborted.popitem(last=False)
            self._cond.notify_all()
        key = self._router.worker_of(trajectory_id)
        if key is not None:
            await asyncio.wait_for(self._handle(key).abort.remote(trajectory_id), self._call_timeout_s)
            self._router.forget(trajectory_id)

    async def suspend(self) -> None:
        self._suspended = True

    async def resume(self) -> None:
        async with self._cond:
            self._suspended = False
            self._cond.notify_all()

    async def update_weights_to(self, version: int) -> dict[str, dict[str, float]]:
        """Every worker serves `version` (pulled from its subscriber); per worker: its swap timings."""
        keys = list(self._router.in_flight())
        results = await asyncio.wait_for(
            asyncio.gather(*(self._handle(k).update_weights_to.remote(version) for k in keys)), self._call_timeout_s
        )
        await self._learn_names()
        return {self._name(k): r for k, r in zip(keys, results)}

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
            "in_flight": {self._name(k): n for k, n in self._router.in_flight().items()},
            "trajectories_assigned": {self._name(k): n for k, n in self._router.assigned().items()},
        }
        if workers:
            keys = list(self._router.in_flight())
            values = await asyncio.wait_for(
                asyncio.gather(*(self._handle(k).stats.remote() for k in keys)), self._call_timeout_s
            )
            out["workers"] = {self._name(k): v for k, v in zip(keys, values)}
        return out

    def _handle(self, key: WorkerKey) -> Any:
        return self._workers[key[0]][key[1]]

    def _name(self, key: WorkerKey) -> str:
        return self._names.get(key, f"{key[0]}[{key[1]}]")

    async def _learn_names(self) -> None:
        missing = [k for k in self._router.in_flight() if k not in self._names]
        if missing:
            names = await asyncio.wait_for(
                asyncio.gather(*(self._handle(k).ready.remote() for k in missing)), self._call_timeout_s
            )
            self._names.update(zip(missing, names))

