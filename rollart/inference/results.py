"""Result records built outside an engine: the answer to a request that was aborted before it ran."""

from __future__ import annotations

from rollart.types import GenerationRequest, GenerationResult


def aborted_result(request: GenerationRequest, worker: str = "") -> GenerationResult:
    """`finish_reason="abort"` with no tokens, for a request of an already-aborted trajectory."""
    return GenerationResult(
        request_id=request.request_id,
        trajectory_id=request.trajectory_id,
        token_ids=(),
        logprobs=(),
        versions=(),
        finish_reason="abort",
        prompt_tokens=len(request.prompt_token_ids),
        worker=worker,
    )
