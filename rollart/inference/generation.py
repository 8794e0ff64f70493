"""What every engine does the same way, whatever computes the tokens: request checks, the per-token record
(token, behaviour logprob, weight version), the result it becomes, and the checks of a weight swap.

In: a `GenerationRequest` with the engine's vocabulary size and context length; the tokens an engine
samples, one at a time, with their logprob and the version that produced them; a weight update's version
and named tensors with the names and shapes the engine accepts. Out: a `Generation` per request that
becomes its `GenerationResult`; a ValueError naming the field or tensor for anything invalid.

Guarantees: a token's version is the version passed with it when it was appended, so tokens sampled
before a swap keep the old version whatever happens after; `check_newer` makes versions only go forward;
`check_weights` changes nothing and raises before the first tensor is loaded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Container, Mapping, get_args

from rollart.config import OnUpdate
from rollart.inference.sampling import validate_sampling
from rollart.types import FinishReason, GenerationRequest, GenerationResult, Span


def check_on_update(on_update: str) -> None:
    if on_update not in get_args(OnUpdate):
        raise ValueError(f"on_update={on_update!r} is invalid: valid are {list(get_args(OnUpdate))}")


def check_request(
    request: GenerationRequest, vocab_size: int, max_context: int, can_decode: bool, live: Container[str]
) -> None:
    """Raise ValueError naming what is wrong with `request` (`live`: the request ids queued or running)."""
    prompt = request.prompt_token_ids
    rid = request.request_id
    if rid in live:
        raise ValueError(f"request_id={rid!r} is already queued or running on this engine")
    if not prompt:
        raise ValueError(f"prompt_token_ids of request {rid!r} is empty: give at least one token")
    if len(prompt) >= max_context:
        raise ValueError(
            f"prompt_token_ids of request {rid!r} has {len(prompt)} tokens; the model's context is "
            f"{max_context}, so a prompt may have at most {max_context - 1}"
        )
    bad = [t for t in prompt if not (0 <= t < vocab_size)]
    if bad:
        raise ValueError(f"prompt_token_ids of request {rid!r} holds ids outside [0, {vocab_size}): {bad[:5]}")
    validate_sampling(request.sampling, vocab_size, can_decode=can_decode)


@dataclass(kw_only=True)
class Generation:
    """One request's output so far: a token, its behaviour logprob and its weight version, per position."""

    request: GenerationRequest
    added_at: float = field(default_factory=time.time)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)  # with sampling.top_logprobs
    prefill_tokens: int = 0  # prompt tokens computed at admission (the rest: a prefix cache, or a same-prompt request)

    def append(self, token: int, logprob: float, version: int,
               top: tuple[tuple[int, float], ...] | None = None) -> None:
        self.tokens.append(int(token))
        self.logprobs.append(float(logprob))
        self.versions.append(int(version))
        if top is not None:
            self.top_logprobs.append(top)

    def result(self, reason: FinishReason, worker: str) -> GenerationResult:
        r = self.request
        return GenerationResult(
            request_id=r.request_id,
            trajectory_id=r.trajectory_id,
            token_ids=tuple(self.tokens),
            logprobs=tuple(self.logprobs),
            versions=tuple(self.versions),
            finish_reason=reason,
            prompt_tokens=len(r.prompt_token_ids),
            prefill_tokens=self.prefill_tokens,
            worker=worker,
            spans=(Span("generate", self.added_at, time.time(), worker),),
            top_logprobs=tuple(self.top_logprobs),
        )


def check_newer(version: int, served: int) -> None:
    """ValueError unless `version` is newer than the `served` one (versions never go backwards)."""
    if version <= served:
        raise ValueError(
            f"weights version {version} is not newer than the served version {served}: versions never go backwards"
        )


def check_weights(
    tensors: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], required: Container[str] | None = None
) -> None:
    """ValueError if a tensor's name is not in `shapes`, its shape differs, or a `required` name is missing.

    `required` defaults to every name of `shapes`.
    """
    unknown = sorted(set(tensors) - set(shapes))
    if unknown:
        raise ValueError(f"swap_weights: {len(unknown)} tensor names are not in the model, e.g. {unknown[:5]}")
    required = shapes if required is None else required
    missing = sorted(n for n in shapes if n in required and n not in tensors)
    if missing:
        raise ValueError(f"swap_weights: {len(missing)} parameters are missing, e.g. {missing[:5]}")
    for name, value in tensors.items():
        if tuple(value.shape) != tuple(shapes[name]):
            raise ValueError(
                f"swap_weights: tensor {name!r} has shape {tuple(value.shape)}, the model's is {tuple(shapes[name])}"
            )
