"""Sampling: validate `SamplingParams`, turn a batch of logits into tokens and their logprobs.

In: raw next-token logits `(B, V)` and one `SamplingParams` per row. Out: one token id per row and the
log-probability of that token under the distribution it was actually drawn from.

The logprob contract (what the trainer receives as the behaviour logprob of each token):
- temperature > 0: the distribution is built in this order, as in transformers and vLLM:
  `logits / temperature`, then top-k (keep the k largest; ties with the k-th are kept), then top-p (keep
  the smallest most-probable set whose mass reaches p; the most probable token is always kept), then a
  softmax over what is left. The logprob is the log of the chosen token's probability under *that*
  renormalised distribution. A trainer that computes its own logprobs at temperature 1 without filters
  must apply the same transform to compare like with like (or sample at T=1, top_k=0, top_p=1, where
  the two agree).
- temperature == 0 (greedy): the token is the argmax and its logprob is `log_softmax(logits)` at T=1
  with no filter — the policy's own probability of the greedy token (a distribution concentrated on the
  argmax would always give 0.0, which says nothing).

Guarantees: rows are independent — each row draws from its own `torch.Generator` exactly once per token,
so a seeded request gives the same tokens whatever its batch-mates are (up to the float noise of
batched matmuls). The functions here are pure apart from advancing the generators they are given.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from rollart.types import SamplingParams

MAX_SEED = 2**63 - 1
MAX_TOP_LOGPROBS = 20


def validate_sampling(params: SamplingParams, vocab_size: int, can_decode: bool) -> None:
    """Raise ValueError naming the first bad field, its value and the valid range."""

    def bad(name: str, value: object, valid: str) -> ValueError:
        return ValueError(f"sampling.{name}={value!r} is invalid: {valid}")

    t = params.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise bad("temperature", t, "it must be a finite number >= 0 (0 = greedy)")
    p = params.top_p
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 1):
        raise bad("top_p", p, "it must be in (0, 1] (1 = off)")
    k = params.top_k
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise bad("top_k", k, "it must be an integer >= 0 (0 = off)")
    n = params.max_new_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad("max_new_tokens", n, "it must be an integer >= 1")
    for tok in params.stop_token_ids:
        if isinstance(tok, bool) or not isinstance(tok, int) or not (0 <= tok < vocab_size):
            raise bad("stop_token_ids", params.stop_token_ids, f"every id must be an integer in [0, {vocab_size})")
    for s in params.stop_strings:
        if not isinstance(s, str) or not s:
            raise bad("stop_strings", params.stop_strings, "every stop string must be a non-empty str")
    if params.stop_strings and not can_decode:
        raise bad("stop_strings", params.stop_strings, "stop strings need an engine built with a tokenizer")
    k = params.top_logprobs
    if isinstance(k, bool) or not isinstance(k, int) or not (0 <= k <= MAX_TOP_LOGPROBS):
        raise bad("top_logprobs", k, f"it must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    g = params.grammar
    if g is not None and (not isinstance(g, str) or not g.strip()):
        raise bad("grammar", g, "it must be None or a non-empty grammar (llguidance's Lark dialect)")
    if g is not None and not can_decode:
        raise bad("grammar", "...", "constrained decoding needs an engine built with a tokenizer")
    if not isinstance(params.ignore_eos, bool):
        raise bad("ignore_eos", params.ignore_eos, "it must be True or False")
    seed = params.seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not (0 <= seed <= MAX_SEED)):
        raise bad("seed", seed, f"it must be None or an integer in [0, {MAX_SEED}]")


def sampling_logprobs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Log-probabilities `(B, V)` of the distribution each row samples from (see the module docstring).

    Greedy rows get `log_softmax(logits)`; filtered-out tokens get -inf. Computed in float32.
    """
    logits = logits.float()
    temps = [p.temperature for p in params]
    if all(t == 0 for t in temps):
        return torch.log_softmax(logits, dim=-1)
    scale = torch.tensor([t if t > 0 else 1.0 for t in temps], dtype=logits.dtype, device=logits.device)
    scaled = logits / scale[:, None]
    sampled = [p.temperature > 0 for p in params]
    top_k = [p.top_k if s else 0 for p, s in zip(params, sampled)]
    top_p = [p.top_p if s else 1.0 for p, s in zip(params, sampled)]
    if any(top_k) or any(q < 1.0 for q in top_p):
        scaled = _filter_top_k_top_p(scaled, top_k, top_p)
    return torch.log_softmax(scaled, dim=-1)


def _filter_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set to -inf what top-k, then top-p, removes, row by row (k = 0 or p = 1 leave a row unfiltered)."""
    vocab = logits.shape[-1]
    sorted_vals, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    if any(top_k):
        k = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_k], device=logits.device)
        kth = sorted_vals.gather(1, (k - 1)[:, None])
        sorted_vals = sorted_vals.masked_fill(sorted_vals < kth, float("-inf"))
    if any(q < 1.0 for q in top_p):
        p = torch.tensor(top_p, dtype=logits.dtype, device=logits.device)
        probs = torch.softmax(sorted_vals, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly more probable tokens
        drop = (mass_before >= p[:, None]) & (p[:, None] < 1.0)
        drop[:, 0] = False  # the most probable token always stays
        sorted_vals = sorted_vals.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, sorted_idx, sorted_vals)


def top_alternatives(logprobs: torch.Tensor, k: int) -> tuple[tuple[int, float], ...]:
    """The k most probable (token, logprob) of one row's distribution, most probable first (-inf ones left out)."""
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]))
    return tuple((int(t), float(v)) for t, v in zip(ids.tolist(), values.tolist()) if v != float("-inf"))


def choose_tokens(
    logprobs: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> tuple[list[int], list[float]]:
    """One token per row (argmax when greedy, else a draw from the row's own generator) and its logprob."""
    greedy = logprobs.argmax(dim=-1)
    chosen = greedy.clone()
    for i, (p, gen) in enumerate(zip(params, generators)):
        if p.temperature > 0:
            chosen[i] = torch.multinomial(logprobs[i].exp(), 1, generator=gen)[0]
    picked = logprobs.gather(1, chosen[:, None])[:, 0]
    return chosen.tolist(), picked.tolist()
