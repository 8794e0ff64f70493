"""`WeightSwapExtension`: methods vLLM mixes into each of its model workers (`worker_extension_cls`), so a
weight update can be shipped to them in buckets and applied in place.

In (through `collective_rpc`, so the same calls work in-process and across vLLM's worker processes under
tensor parallelism): `rollart_stage_bucket(blob)` — one bucket of named tensors as safetensors bytes
(tensors themselves do not pickle through vLLM's RPC; bytes do); then `rollart_apply_staged()`. Out: the
model serves the new weights; `rollart_apply_staged` returns how many tensors it loaded.

Why the extra step after vLLM's `reload_weights`: with tied input/output embeddings the output head shares
the embedding's weight, but on CPU vLLM prepacks that weight for its GEMM at load time; a reload updates
the embedding and leaves the packed copy stale, so the logits would silently come from the old weights.
`rollart_apply_staged` re-ties the head to the embedding and repacks it (a no-op on CUDA, where nothing
is prepacked).

Guarantee: staged tensors are applied all at once and then dropped; `rollart_discard_staged` drops them
without applying, so an update that fails while its buckets travel leaves the served weights as they were
(the engine checks every name and shape before the first bucket leaves).
"""

from __future__ import annotations

from typing import Any


class WeightSwapExtension:
    """Mixed into vLLM's worker class; `self` is the worker (it has `model_runner` and `vllm_config`)."""

    def rollart_stage_bucket(self, blob: bytes) -> int:
        from safetensors.torch import load

        staged: dict[str, Any] = self.__dict__.setdefault("_rollart_staged", {})
        tensors = load(blob)
        staged.update(tensors)
        return len(tensors)

    def rollart_discard_staged(self) -> None:
        self.__dict__.pop("_rollart_staged", None)

    def rollart_apply_staged(self) -> int:
        staged: dict[str, Any] = self.__dict__.pop("_rollart_staged", {})
        if not staged:
            raise ValueError("rollart_apply_staged: no weights were staged")
        self.reload_weights(weights_iterator=iter(staged.items()))
        model = self.model_runner.get_model()
        if getattr(model.config, "tie_word_embeddings", False):
            _retie_output_head(model)
        return len(staged)


def _retie_output_head(model: Any) -> None:
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head is embed:
        return
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
