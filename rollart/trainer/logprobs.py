"""Per-token log-probabilities and entropy from hidden states against the LM head, a chunk of tokens at a time.

In: `hidden` [K, H] — the final (normed) hidden states of the K positions whose next token is trained on —
the LM head (a module or function [n, H] → [n, V] logits: the model's own `lm_head`, LoRA layers and all),
the K target token ids, and `chunk_tokens`. Out: log π(target) [K] in float32 (with grad) and, if asked,
the policy entropy [K] (float32, no grad).

    logits = head(h) in the compute dtype, then float32:  log π(t) = logits[t] − logsumexp(logits)
    entropy = logsumexp(logits) − Σ softmax(logits) · logits

Guarantee: neither the forward nor the backward holds the float32 logits of more than `chunk_tokens` tokens
at once. Each chunk runs under a non-reentrant activation checkpoint: the forward keeps only its logprobs,
and the backward recomputes that one chunk's logits, takes its gradient, and frees them before the next
chunk. `chunk_tokens=0` (or ≥ K) computes all K at once — the same values and gradients (tested), with K × V
logits alive; that is the baseline `rollart bench trainer` measures the chunks against.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

Head = Callable[[Tensor], Tensor]


def _chunk(head: Head, hidden: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor]:
    logits = head(hidden).float()
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, logp.new_zeros(())
    with torch.no_grad():
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def token_logprobs(hidden: Tensor, head: Head, targets: Tensor, chunk_tokens: int,
                   with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """(log π(targets) [K] float32, entropy [K] or None) — see the module docstring."""
    k = hidden.shape[0]
    if chunk_tokens <= 0 or chunk_tokens >= k:
        logp, entropy = _chunk(head, hidden, targets, with_entropy)
        return logp, entropy if with_entropy else None
    logps, entropies = [], []
    recompute = torch.is_grad_enabled()
    for start in range(0, k, chunk_tokens):
        h, t = hidden[start:start + chunk_tokens], targets[start:start + chunk_tokens]
        if recompute:
            logp, entropy = checkpoint(_chunk, head, h, t, with_entropy, use_reentrant=False)
        else:
            logp, entropy = _chunk(head, h, t, with_entropy)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps), torch.cat(entropies) if with_entropy else None
