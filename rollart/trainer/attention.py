"""Attention for packed rows: each sample of a row attends causally to itself only (varlen attention).

In: transformers' attention call — query/key/value [b, heads, T, d] — plus, for a packed row, the sample
boundaries `cu_seq_lens_q` (the keyword flash-attention's varlen path reads, so the trainer passes the
same arguments whichever kernel runs). Out: the attention output [b, T, heads, d].

Registered with transformers as `ATTENTION` for the trainer's model: with boundaries it runs causal SDPA
once per sample *length* — the samples of one length gathered into a batch of their own, their outputs
scattered back into the row — so each sample attends only to itself (never a T × T mask over the row: on
CPU a masked SDPA would compute every cross-sample score it then throws away), and a micro-batch of many
short samples of few lengths (single-turn tasks) costs a few SDPA calls, not one per sample (36 samples of
4 lengths: 4 calls instead of 36 per layer, forward and backward). Without boundaries (a padded
micro-batch) it is transformers' own SDPA with its padding mask, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

ATTENTION = "rollart_packed"
_registered = False


def register() -> str:
    """Register the attention (and its mask builder, SDPA's) with transformers once; its name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ATTENTION, packed_attention)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        _registered = True
    return ATTENTION


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, cu_seq_lens_q: torch.Tensor | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for unused in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(unused, None)
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    bounds = cu_seq_lens_q.tolist()
    by_length: dict[int, list[int]] = {}
    for a, b in zip(bounds[:-1], bounds[1:]):
        by_length.setdefault(b - a, []).append(a)
    if len(by_length) == len(bounds) - 1:  # every sample its own length: no gathering to do
        parts = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None,
                                        is_causal=True, **kwargs)[0]
                 for a, b in zip(bounds[:-1], bounds[1:])]
        return torch.cat(parts, dim=1), None
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])  # [1, T, heads, d]
    for length, starts in by_length.items():
        # [n, length] token positions of the n samples of this length; [1, h, T, d] → [n, h, length, d]
        where = (torch.tensor(starts, device=query.device)[:, None] + torch.arange(length, device=query.device)).view(-1)
        q, k, v = (t[0].index_select(1, where).unflatten(1, (len(starts), length)).transpose(0, 1)
                   for t in (query, key, value))
        part = sdpa_attention_forward(module, q, k, v, None, is_causal=True, **kwargs)[0]  # [n, length, h, d]
        out = out.index_copy(1, where, part.reshape(1, -1, *part.shape[2:]))
    return out, None
