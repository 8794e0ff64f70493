"""`InferenceWorker`: the Ray actor that serves one inference engine replica on its pool.

In: a `RunConfig`, the pool it was placed on and its index there, and optionally the weights plane's
`WeightSubscriber`. Calls (all async, so ADD/ABORT reach the engine between any two steps):
`generate(request)`, `abort(trajectory_id)`, `preempt(trajectory_id)`, `update_weights(version)`, `stats()`; and the batched form of
`generate` the LLM proxy uses (`submit(channel, items)` + `take(channel)`: many requests per message, each result
handed back with the first `take` after its step, `rollart.base.batched_calls`). Out: one `GenerationResult` per
request, returned the moment the engine step that finished it ends.

Guarantees:
- The engine runs on its own thread (`EngineLoop`); every engine call happens at a step boundary.
- Weight versions never go backwards: `update_weights(v)` with v ≤ the served version does nothing.
  With a subscriber, the newest published version is pulled in the background while the engine
  generates (an asyncio task on the actor's event loop that awaits the store: nothing blocks the loop
  that serves requests) and prepared on a thread (`InferenceEngine.prepare_weights`: a LoRA merge);
  `update_weights` then only swaps. `stats()` reports background pull time and the
  exposed time (what a swap waited for: a pull not done yet, plus the swap itself).
- Requests in flight across a swap are kept: re-prefilled under the new weights, or decoding on over
  their old KV (`inference.on_update`); their earlier tokens keep their old version.
- The engine is the built-in `BuiltinEngine` or `VLLMEngine` (`inference.engine`); vLLM is imported only when
  it is asked for.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping

import torch

from rollart.base.batched_calls import Outbox, Outcome
from rollart.config import RunConfig
from rollart.inference.engine_loop import EngineLoop
from rollart.inference.prefetch import WeightPrefetcher
from rollart.inference.protocol import InferenceEngine
from rollart.models import load_model, load_tokenizer, resolve_model_path
from rollart.resources.affinity import affinity
from rollart.resources.names import worker_name
from rollart.types import GenerationRequest, GenerationResult, WeightSubscriber

TAKE_WAIT_S = 30.0  # how long one `take` waits for a result before it answers [] (the caller asks again)


def build_engine(cfg: RunConfig, pool: str, name: str, version: int = 0) -> InferenceEngine:
    """The engine `cfg.inference.engine` names, on the device of `pool`, loaded with `cfg.model`.

    vLLM is imported only here, and only for `engine=vllm` (the rest of rollart runs without it)."""
    if pool not in cfg.pools:
        raise ValueError(f"pool {pool!r} is not declared (declared: {sorted(cfg.pools)})")
    inf = cfg.inference
    device = cfg.pools[pool].device or "cpu"
    path = resolve_model_path(cfg.model, cfg.seed)
    if inf.engine == "vllm":
        from rollart.inference.vllm_engine import VLLMEngine

        return VLLMEngine(
            path, device=device, dtype=cfg.model.dtype, max_batch_size=inf.max_batch_size,
            kv_cache_mb=inf.vllm.kv_cache_mb, gpu_memory_utilization=inf.vllm.gpu_memory_utilization,
            tensor_parallel_size=inf.vllm.tensor_parallel_size, max_model_len=inf.vllm.max_model_len,
            enforce_eager=inf.vllm.enforce_eager, block_size=inf.vllm.block_size, version=version, worker=name,
            seed=cfg.seed,
            on_update=inf.on_update, transfer_bucket_mb=cfg.weights.bucket_mb,
            trust_remote_code=cfg.model.trust_remote_code,
        )
    from rollart.inference.builtin_engine import BuiltinEngine

    return BuiltinEngine(
        load_model(path, cfg.model.dtype, device, adapter=cfg.model.adapter,
                   trust_remote_code=cfg.model.trust_remote_code),
        load_tokenizer(path, cfg.model.trust_remote_code),
        max_batch_size=inf.max_batch_size,
        prefix_cache_mb=inf.prefix_cache_mb,
        version=version,
        worker=name,
        seed=cfg.seed,
        on_update=inf.on_update,
    )


def gpus_per_worker(cfg: RunConfig, pool: str) -> float | None:
    """GPUs one inference worker on `pool` asks Ray for: vLLM's tensor-parallel size on a CUDA pool, else the
    placement default (None: one GPU on a CUDA pool, none elsewhere)."""
    on_cuda = (cfg.pools[pool].device or "").startswith("cuda") if pool in cfg.pools else False
    if cfg.inference.engine == "vllm" and on_cuda:
        return float(cfg.inference.vllm.tensor_parallel_size)
    return None


@affinity("gen_decode", fallback=["gen_prefill"], role="inference")
class InferenceWorker:
    """One inference replica (a Ray async actor); see the module docstring."""

    def __init__(
        self,
        cfg: RunConfig,
        pool: str,
        index: int = 0,
        subscriber: WeightSubscriber | None = None,
        version: int = 0,
    ) -> None:
        torch.set_num_threads(cfg.inference.num_threads)
        self.name = worker_name("inference", pool, index)
        self._timeout_s = cfg.inference.request_timeout_s
        self._loop = EngineLoop(build_engine(cfg, pool, self.name, version), self.name)
        self._prefetch = (
            WeightPrefetcher(subscriber, version, cfg.inference.weights_poll_s,
                             prepare=self._loop.engine.prepare_weights)
            if subscriber is not None else None
        )
        self._outbox = Outbox()
        self._update_lock = asyncio.Lock()
        self._swaps = 0
        self._exposed_s = 0.0

    async def ready(self) -> str:
        """The worker's name, once its model is loaded (await it after creating the actor)."""
        self._start_prefetch()
        return self.name

    def _start_prefetch(self) -> None:
        # on the actor's event loop, which the constructor does not run on: started by the first call
        if self._prefetch is not None:
            self._prefetch.start()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self._start_prefetch()
        return await self._loop.generate(request, self._timeout_s)

    async def submit(self, channel: str, items: list[tuple[int, GenerationRequest]]) -> None:
        """`generate` for each (sequence number, request), answered through `take(channel)`."""
        self._start_prefetch()
        self._outbox.start(channel, [(seq, self._loop.generate(request, self._timeout_s)) for seq, request in items])

    async def take(self, channel: str, wait_s: float = TAKE_WAIT_S) -> list[Outcome]:
        """The outcomes of `channel`'s submitted requests ended since its last `take` (waits for one)."""
        return await self._outbox.take(channel, wait_s)

    async def abort(self, trajectory_id: str) -> None:
        self._loop.abort_trajectory(trajectory_id)

    async def preempt(self, trajectory_id: str) -> None:
        """End the trajectory's running turn here (the LLM proxy goes on with it elsewhere); later turns may come."""
        self._loop.preempt_trajectory(trajectory_id)

    async def version(self) -> int:
        return self._loop.engine.version

    async def in_flight(self) -> int:
        return self._loop.in_flight

    async def update_weights(self, version: int) -> dict[str, float]:
        """Serve `version` from the subscriber (prefetched if possible); a no-op if already served. A swap's
        reply carries the engine's `recompute_tokens` counter as it stood just before it (what the earlier
        swaps made it recompute): the driver's count per sync, with no round trip of its own."""
        if self._prefetch is None:
            raise RuntimeError(f"{self.name}: update_weights needs a WeightSubscriber; none was given")
        async with self._update_lock:
            served = self._loop.engine.version
            if version <= served:
                return {"version": float(served), "swapped": 0.0, "pull_s": 0.0, "swap_s": 0.0, "exposed_s": 0.0}
            self._start_prefetch()
            start = time.perf_counter()
            tensors = await self._prefetch.take(version)
            pull_s = time.perf_counter() - start
            return {**await self._swap(version, tensors, exposed_since=start), "pull_s": pull_s}

    async def _swap(self, version: int, tensors: Mapping[str, Any], exposed_since: float) -> dict[str, float]:
        def swap(engine: InferenceEngine) -> tuple[float, float]:
            start = time.perf_counter()
            recomputed = float(engine.stats().get("recompute_tokens", 0.0))  # (counted before this swap's own)
            engine.swap_weights(version, tensors)
            return time.perf_counter() - start, recomputed

        swap_s, recomputed = await self._loop.call(swap, timeout_s=self._timeout_s)
        exposed = time.perf_counter() - exposed_since
        self._swaps += 1
        self._exposed_s += exposed
        return {"version": float(version), "swapped": 1.0, "swap_s": swap_s, "exposed_s": exposed,
                "recompute_tokens": recomputed}

    async def stats(self) -> dict[str, Any]:
        engine = await self._loop.call(lambda e: e.stats())
        return {
            "worker": self.name,
            **engine,
            "in_flight": float(self._loop.in_flight),
            "peak_rss_mb": _peak_rss_mb(),
            "weight_swaps": float(self._swaps),
            "exposed_update_s_total": self._exposed_s,
            **(self._prefetch.stats() if self._prefetch else {}),
            **({"prefetch_error": self._prefetch.last_error} if self._prefetch and self._prefetch.last_error else {}),
        }

    async def shutdown(self) -> None:
        """Stop the engine thread and the prefetcher (the actor can then be killed cleanly)."""
        if self._prefetch is not None:
            self._prefetch.close()
        self._outbox.cancel_all()
        self._loop.close()
        self._loop.engine.close()


def _peak_rss_mb() -> float:
    """This process's peak resident set size (Linux VmHWM; ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
