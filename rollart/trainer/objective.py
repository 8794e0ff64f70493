"""What the trainer needs from a policy objective (the driver passes `rollart.algo.PolicyObjective`).

The trainer does the model work — forward passes, micro-batches, data parallelism, the optimizer — and
leaves the algorithm to an injected objective, so it never imports the `algo` plane (docs/architecture.md §3) and any
loss with this shape plugs in. Tensors are [b, T] per predicted token, `advantages` [b].
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class Objective(Protocol):
    @property
    def uses_reference(self) -> bool:
        """True when the loss needs reference-model logprobs (a KL term): the trainer then keeps a frozen
        copy of the weights RL started from (after the warm start) and passes `ref_logprobs`."""
        ...

    def update_plan(self, num_samples: int, seed: str) -> list[tuple[int, ...]]:
        """The optimizer steps one batch of `num_samples` makes, in order: each a tuple of sample indices
        (a mini-batch). With more than one step the trainer computes `proximal_logprobs` once per batch,
        with the weights before the first step; with one it passes None (the detached current policy)."""
        ...

    def token_weights(self, mask: Tensor, total_tokens: float, total_seqs: float) -> Tensor:
        """Aggregation weights of one micro-batch given its mini-batch's model-token and sequence counts."""
        ...

    def __call__(
        self,
        logprobs: Tensor,
        behaviour_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        weights: Tensor,
        proximal_logprobs: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """(loss of this micro-batch, summed statistics: tokens, clipped, ratio_max, iw_sum, iw_max,
        iw_truncated, approx_kl_sum, behaviour_kl_sum, pg_loss [, ref_kl_sum, kl_loss])."""
        ...
