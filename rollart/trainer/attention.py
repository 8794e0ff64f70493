"""Attention for packed rows: each sample of a row attends causally to itself only (varlen attention).

In: transformers' attention call — query/key/value [b, heads, T, d] — plus, for a packed row, the sample
boundaries `cu_seq_lens_q` (the keyword flash-attention's varlen path reads, so the trainer passes the
same arguments whichever kernel runs). Out: the attention output [b, T, heads, d].

Registered with transformers as `ATTENTION` for the trainer's model: with boundaries it runs SDPA once per
sample, causal within it (the cost of each sample's own attention, never a T × T mask over the row — on CPU
a masked SDPA would compute every cross-sample score it then throws away); without them (a padded
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
    parts = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None,
                                    is_causal=True, **kwargs)[0]
             for a, b in zip(bounds[:-1], bounds[1:])]
    return torch.cat(parts, dim=1), None
