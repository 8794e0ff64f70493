"""`InferenceEngine`: what an inference worker drives, whatever does the computing (built-in or vLLM).

In: `GenerationRequest`s (`add`), cancellations (`abort`), new weights (`swap_weights`). Out: finished
`GenerationResult`s, returned by the `step()` that finished them.

The contract, in terms any engine can meet (vLLM's `LLMEngine.add_request/abort_request/step` map onto
it one to one; weights onto an in-place reload plus a prefix-cache reset — see `vllm_engine.py`):
- Single-threaded: the caller never runs two methods at once, but for `prepare_weights`. So every call
  made between two `step()`s happens at a step boundary — that is where requests join or leave and where
  weights are swapped.
- `prepare_weights(tensors)` is the work on newly pulled weights that needs no step boundary; the worker
  calls it on another thread while the engine generates (after a background pull) and passes its result to
  `swap_weights`, which also accepts unprepared weights. The built-in engine merges a LoRA adapter here;
  an engine with nothing to prepare returns its argument.
- `step()` advances every running request by at most one token (an engine may also admit queued ones)
  and returns the results that finished in it. Each request yields exactly one result: finish reason
  `stop`, `length` or `abort`.
- `abort(request_id)` of a queued or running request makes the next `step()` return it with
  `finish_reason="abort"` and the tokens produced so far; an unknown id is a no-op.
- `swap_weights(version, tensors)` with a version newer than the served one: the new weights serve
  every later token. Running requests are kept; with `on_update="recompute"` (the default) the engine
  recomputes their KV under the new weights before their next token, with `"keep"` they decode on over
  the KV the old weights computed. Either way no request admitted later reuses KV of older weights.
  Tokens produced earlier keep their old version stamp. Versions never go backwards (an older or equal
  version is a ValueError).
- `swap_weights(version, adapter)` with a `rollart.types.LoraAdapter` (a LoRA run publishes only its
  adapter, in PEFT's format): the engine serves base + adapter, where the base is the model it loaded. The
  built-in engine merges (W_base + s·B·A from a kept copy of W_base). `VLLMEngine` does not serve LoRA
  yet (the config refuses `train.lora` with `inference.engine=vllm`); it would instead start
  with `enable_lora=True` and `max_lora_rank ≥ train.lora.rank`, register each version as a new
  `LoRARequest` (a fresh int id; the adapter written as a PEFT directory, or handed over in memory where
  its version allows), tag every later request with it and drop the previous one — unmerged, so no
  weight copy is touched.
- `close()` releases what the engine holds (worker processes, memory); it serves no more afterwards.
- Every result token carries its behaviour logprob (see `rollart.inference.sampling`) and the weight
  version that produced it; a bad `SamplingParams` is a ValueError from `add` naming the field.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

from rollart.types import GenerationRequest, GenerationResult, LoraAdapter


@runtime_checkable
class InferenceEngine(Protocol):
    @property
    def version(self) -> int:
        """The weight version now served."""
        ...

    def add(self, request: GenerationRequest) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> list[GenerationResult]: ...

    def has_work(self) -> bool:
        """True while any request is queued or running (a worker sleeps when False)."""
        ...

    def prepare_weights(self, tensors: Mapping[str, Any] | LoraAdapter) -> Any: ...

    def swap_weights(self, version: int, tensors: Any) -> None:
        """Serve `tensors` (weights, a `LoraAdapter`, or what `prepare_weights` made of them) as `version`."""
        ...

    def stats(self) -> dict[str, float]: ...

    def close(self) -> None: ...
