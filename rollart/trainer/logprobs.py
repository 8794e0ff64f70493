"""Per-token log-probabilities and entropy from hidden states against the LM head, a chunk of tokens at a time.

In: `hidden` [K, H] — the final (normed) hidden states of the K positions whose next token is trained on —
the LM head (a module or function [n, H] → [n, V] logits: the model's own `lm_head`, LoRA layers and all),
the K target token ids, and `chunk_tokens`. Out: log π(target) [K] in float32 (with grad) and, if asked,
the policy entropy [K] (float32, no grad).

    logits = head(h) in the compute dtype, then float32:  log π(t) = logits[t] − logsumexp(logits)
    entropy = logsumexp(logits) − Σ softmax(logits) · logits

Guarantee: neither the forward nor the backward holds the logits of more than `chunk_tokens` tokens at once.
With more than one chunk, each runs under a non-reentrant activation checkpoint: the forward keeps only its
logprobs, and the backward recomputes that one chunk's logits, takes its gradient, and frees them before the
next chunk (K ≤ `chunk_tokens`: one chunk, its logits kept for the backward, nothing recomputed).
Within a chunk, `TargetLogSoftmax` computes from the head's logits in their own dtype: the float32 copies it
makes (for the log-sum-exp, the entropy, the softmax of the gradient) cover `BLOCK` logits (8 MB) at a time —
64 tokens at a 32 K vocabulary, a whole chunk at the tiny model's 1 K — so a chunk holds its logits, their
gradient (both in the compute dtype) and a few float32 blocks, not the float32 logits, softmax and gradient
terms autograd would keep whole (measured, 1,536 tokens in chunks of 512 against a 32 K × 640 head: peak
365 → 129 MB in bf16, 404 → 244 MB in float32). The entropy is computed in the forward only, not again in
the recompute.

`chunk_tokens=0` computes all K at once through plain autograd (float32 logits, `log_softmax`'s
formula written out) — the reference the chunked path is tested against (same values and gradients) and
the baseline `rollart bench trainer` measures the chunks against.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

Head = Callable[[Tensor], Tensor]
BLOCK = 1 << 21  # float32 logits (8 MB) a chunk's block of tokens holds at once: 64 tokens at a 32 K vocabulary


def _rows(vocab: int) -> int:
    return max(1, BLOCK // vocab)


def _whole(head: Head, hidden: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor]:
    """The reference: every logit in float32 at once, differentiated by autograd."""
    logits = head(hidden).float()
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, logp.new_zeros(())
    with torch.no_grad():
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


class TargetLogSoftmax(torch.autograd.Function):
    """(log softmax(logits)[target] [n] float32, entropy [n] float32 or a 0-d zero, not differentiable) from
    logits [n, V] in any float dtype; float32 copies of at most `BLOCK` logits alive at a time, forward and
    backward. The backward saves the logits as they came (the compute dtype) and the log-sum-exp [n].

    Gradient: d log π(t)/d logits = onehot(t) − softmax(logits), times the incoming gradient — the same
    terms, in the same float32 arithmetic, as autograd's through `_whole`, cast back to the logits' dtype."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor]:
        n, rows = logits.shape[0], _rows(logits.shape[-1])
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n, dtype=torch.float32, device=logits.device) if with_entropy else None
        for i in range(0, n, rows):
            block = logits[i:i + rows].float()
            lse[i:i + rows] = torch.logsumexp(block, dim=-1)
            if entropy is not None:
                entropy[i:i + rows] = lse[i:i + rows] - (torch.softmax(block, dim=-1) * block).sum(-1)
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float() - lse
        ctx.save_for_backward(logits, targets, lse)
        if entropy is None:
            entropy = lse.new_zeros(())
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor, _grad_entropy: Tensor) -> tuple[Tensor, None, None]:
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        rows = _rows(logits.shape[-1])
        for i in range(0, logits.shape[0], rows):
            g = grad_logp[i:i + rows, None].float()
            block = torch.exp(logits[i:i + rows].float() - lse[i:i + rows, None])  # softmax, a fresh tensor
            block.mul_(-g).scatter_add_(-1, targets[i:i + rows, None], g)
            grad[i:i + rows] = block
        return grad, None, None


class _Chunk:
    """One chunk's computation for `checkpoint`: the entropy (no grad) on the first call only — the
    backward's recompute needs the logits and log-sum-exp it saves, never the entropy."""

    def __init__(self, head: Head, with_entropy: bool) -> None:
        self.head, self.with_entropy = head, with_entropy

    def __call__(self, hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        logp, entropy = TargetLogSoftmax.apply(self.head(hidden), targets, self.with_entropy)
        self.with_entropy = False
        return logp, entropy


def token_logprobs(hidden: Tensor, head: Head, targets: Tensor, chunk_tokens: int,
                   with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """(log π(targets) [K] float32, entropy [K] or None) — see the module docstring."""
    k = hidden.shape[0]
    if chunk_tokens <= 0:
        logp, entropy = _whole(head, hidden, targets, with_entropy)
        return logp, entropy if with_entropy else None
    logps, entropies = [], []
    recompute = torch.is_grad_enabled() and k > chunk_tokens  # one chunk: its saved logits are all there is
    for start in range(0, k, chunk_tokens):
        h, t = hidden[start:start + chunk_tokens], targets[start:start + chunk_tokens]
        chunk = _Chunk(head, with_entropy)
        logp, entropy = checkpoint(chunk, h, t, use_reentrant=False) if recompute else chunk(h, t)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps), torch.cat(entropies) if with_entropy else None
