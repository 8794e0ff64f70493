"""`BuiltinLentEngine`: the built-in engine a trainer rank runs on its own weights while it waits for a batch.

In: the `RunConfig`, and from the trainer rank that builds it in its own process (`lent_engine_factory(cfg)`, which
the job hands the trainer — the trainer plane never imports this one): a name and the rank's torch device. Then
`serve(version, weights)` with the weights as the rank publishes them, and the inference worker's calls.
Out: the `rollart.types.LentEngine` protocol — `GenerationResult`s like an `InferenceWorker`'s, each token's version
the trainer's.

Guarantees:
- No weight transfer: `serve` hands the engine the rank's own tensors, which it adopts as its parameters where
  dtype and device match (`BuiltinEngine.swap_weights`; a sharded rank's gathered copies, a LoRA run's adapter
  merged into the engine's base as every inference worker merges it). So what it serves at version n is what the
  weight store carries for n, bit for bit. A `serve` at the version already served only resumes serving.
- The engine computes only between `serve` and `stop`: `stop` preempts every request (each returns aborted with
  its tokens so far, which the LLM proxy continues elsewhere), waits — at most `timeout_s`, then TimeoutError —
  until none is left, and drops the KV and prefix caches, so no forward pass reads the weights while the
  optimizer writes them and the trainer gets its memory back. A request arriving while it does not serve (a
  turn routed just before the proxy took the devices back) returns aborted at once, and the proxy moves it on.
- Built at a rank's first loan, it loads `model.path` once (a transient copy that the first `serve` replaces by
  the rank's own tensors), as an inference worker loads it.
- Calls may come from any thread (the rank's actor is a threaded actor): each runs on this object's own event
  loop thread, bounded in time; the engine steps on the `EngineLoop`'s thread, as in an `InferenceWorker`.

The built-in engine even where the pools run vLLM is why preflight refuses `train.elastic_generation` beside
`inference.engine=vllm` for now: one run would sample with two engines.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any, Awaitable, Callable, Iterable, Mapping, TypeVar

from rollart.base.batched_calls import Outbox, Outcome
from rollart.config import RunConfig
from rollart.inference.builtin_engine import BuiltinEngine
from rollart.inference.engine_loop import EngineLoop
from rollart.inference.results import aborted_result
from rollart.models import load_model, load_tokenizer, resolve_model_path
from rollart.types import GenerationRequest, GenerationResult, LentEngine, LoraAdapter

T = TypeVar("T")
_CALL_MARGIN_S = 30.0  # a call's own bound (a take's wait, the request timeout) fires first; this guards a hang
_STOP_POLL_S = 0.01


class BuiltinLentEngine:
    def __init__(self, cfg: RunConfig, name: str, device: str) -> None:
        inf = cfg.inference
        path = resolve_model_path(cfg.model, cfg.seed)
        engine = BuiltinEngine(
            load_model(path, cfg.model.dtype, device, trust_remote_code=cfg.model.trust_remote_code),
            load_tokenizer(path, cfg.model.trust_remote_code),
            max_batch_size=inf.max_batch_size, prefix_cache_mb=inf.prefix_cache_mb, version=-1, worker=name,
            seed=cfg.seed, on_update=inf.on_update,
        )
        self.name = name
        self._timeout_s = inf.request_timeout_s
        self._engine = EngineLoop(engine, name)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"lent-{name}", daemon=True)
        self._thread.start()
        self._outbox = Outbox()  # used on self._loop only
        self.serving = False  # flipped on self._loop only, so a submit sees it before or after a stop, never during
        self._loans = 0
        self._preempted = 0
        self._busy_at_serve = 0.0  # the engine's busy seconds when the current loan began

    # --- the trainer rank's side ------------------------------------------------------------------------
    def serve(self, version: int, weights: Mapping[str, Any] | Iterable[tuple[str, Any]] | LoraAdapter) -> None:
        tensors = weights if isinstance(weights, LoraAdapter) else dict(weights)  # (a sharded rank gathers here)

        def swap(engine: Any) -> None:
            if version > engine.version:
                engine.swap_weights(version, tensors)

        async def start() -> None:
            await self._engine.call(swap, timeout_s=self._timeout_s)
            self._busy_at_serve = self._engine.busy_s
            self.serving = True

        self._run(start(), self._timeout_s)
        self._loans += 1

    def stop(self, timeout_s: float) -> dict[str, float]:
        async def stop_serving() -> int:
            self.serving = False
            return self._engine.preempt_all()

        ended = self._run(stop_serving(), timeout_s)
        deadline = time.monotonic() + timeout_s
        while self._engine.in_flight and time.monotonic() < deadline:
            time.sleep(_STOP_POLL_S)
        if self._engine.in_flight:
            raise TimeoutError(f"{self.name}: {self._engine.in_flight} requests still ran {timeout_s:g} s after the "
                               "trainer took its devices back")
        self._run(self._engine.call(lambda engine: engine.close(), timeout_s=timeout_s), timeout_s)
        self._preempted += ended
        busy, self._busy_at_serve = self._engine.busy_s - self._busy_at_serve, self._engine.busy_s
        return {"preempted": float(ended), "busy_s": busy}

    # --- the inference worker's calls (from the LLM proxy) -------------------------------------------------
    def submit(self, channel: str, items: list[tuple[int, GenerationRequest]]) -> None:
        async def start() -> None:
            self._outbox.start(channel, [(seq, self._generate(request)) for seq, request in items])

        self._run(start(), self._timeout_s)

    def take(self, channel: str, wait_s: float) -> list[Outcome]:
        return self._run(self._outbox.take(channel, wait_s), wait_s)

    def abort(self, trajectory_id: str) -> None:
        self._run(_now(self._engine.abort_trajectory, trajectory_id), self._timeout_s)

    def preempt(self, trajectory_id: str) -> None:
        self._run(_now(self._engine.preempt_trajectory, trajectory_id), self._timeout_s)

    def ready(self) -> str:
        return self.name

    def stats(self) -> dict[str, Any]:
        engine = self._run(self._engine.call(lambda e: e.stats(), timeout_s=self._timeout_s), self._timeout_s)
        return {"worker": self.name, **engine, "in_flight": float(self._engine.in_flight),
                "serving": float(self.serving), "loans": float(self._loans), "preempted": float(self._preempted),
                "busy_s": self._engine.busy_s}

    def close(self) -> None:
        self._engine.close()
        self._engine.engine.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # --- inside ---------------------------------------------------------------------------------------------
    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        if not self.serving:
            return aborted_result(request, self.name)
        return await self._engine.generate(request, self._timeout_s)

    def _run(self, work: Awaitable[T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout_s + _CALL_MARGIN_S)  # type: ignore[arg-type]


async def _now(fn: Callable[[str], None], arg: str) -> None:
    fn(arg)


def lent_engine_factory(cfg: RunConfig) -> Callable[[str, str], LentEngine]:
    """What a trainer rank calls, in its own process, to build its lent engine: `factory(name, device)`."""
    return functools.partial(BuiltinLentEngine, cfg)
