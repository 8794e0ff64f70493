"""The trainer's attention, for any causal LM: packed rows where each sample attends causally to itself only
(varlen attention), and padded micro-batches as transformers' SDPA computes them.

In: transformers' attention call — query/key/value [b, heads, T, d] (key/value may have fewer heads: GQA), the
mask its mask builder made, the layer's `sliding_window` and `softcap` (Gemma 2's attention logit soft-capping)
and `scaling` — plus, for a packed row, the sample boundaries `cu_seq_lens_q` (the keyword flash-attention's
varlen path reads, so the trainer passes the same arguments whichever kernel runs). Out: the attention output
[b, T, heads, d].

Registered with transformers as `ATTENTION` for the trainer's model, with a mask builder of its own: a packed row
comes with no mask at all (`attention_mask=None`), and the builder keeps it so — every model's `create_causal_mask`
and `create_sliding_window_causal_mask` return None for it, whatever the architecture does with masks (Llama,
Mistral, Gemma and Phi build one; Qwen takes a dict of them) — while a padded micro-batch gets SDPA's mask.
A packed row runs SDPA once per sample, causal within it — the cost of each sample's own attention, never a
T × T mask over the row (on CPU a masked SDPA would compute every cross-sample score it then throws away); a
sample longer than its layer's sliding window gets that window as a band within the sample (exactly the mask
transformers builds: a query sees the last `sliding_window` positions, itself included). Soft-capped attention
(which SDPA cannot do) runs as plain matrix products with the same masks, padded or packed.

What it refuses: attention inputs it does not implement (sink logits `s_aux`, a `position_bias`) — with
`packing_problem`'s advice for packed rows. Which architectures can pack at all is `packing_problem`'s:
a model that does not route its attention through transformers' attention interface, or has layers that are not
attention (state-space, linear-attention, convolution layers mix tokens across the whole row), cannot.
"""

from __future__ import annotations

from typing import Any

import torch

ATTENTION = "rollart_packed"
# layer kinds whose tokens meet only through attention this module computes per sample
PACKABLE_LAYERS = frozenset({"full_attention", "sliding_attention"})
_UNSUPPORTED = ("s_aux", "position_bias")
_registered = False


def register() -> str:
    """Register the attention (and its mask builder) with transformers once; its name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(ATTENTION, packed_attention)
        AttentionMaskInterface.register(ATTENTION, padding_mask)
        _registered = True
    return ATTENTION


def padding_mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """SDPA's mask for a padded micro-batch; none for a packed row (its attention reads the sample boundaries)."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def packing_problem(config: Any, model_class: type | None = None) -> str:
    """Why a model of this config (and class) cannot train on packed rows ('' when it can)."""
    name = getattr(model_class, "__name__", None) or getattr(config, "model_type", "this model")
    if model_class is not None and not getattr(model_class, "_supports_attention_backend", False):
        return (f"{name} does not route its attention through transformers' attention interface, so packed rows "
                "(several samples in one row, attention kept within each) cannot be made for it; set "
                "train.packing=false")
    kinds = set(getattr(config, "layer_types", None) or ())
    other = sorted(kinds - PACKABLE_LAYERS)
    if other:
        return (f"{name} has {', '.join(other)} layers, which mix tokens across the whole row, so packed rows "
                "(several samples in one row) would leak between samples; set train.packing=false")
    return ""


def _eager(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           mask: torch.Tensor | None, scaling: float | None, softcap: float | None, dropout: float) -> torch.Tensor:
    """Attention as matrix products (SDPA has no soft-capping): [b, heads, T, d] → [b, T, heads, d]."""
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous()


def _band(n: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[1, 1, n, n] bool: causal, and within the last `window` positions when given."""
    q = torch.arange(n, device=device)[:, None]
    k = torch.arange(n, device=device)[None, :]
    keep = k <= q
    if window is not None:
        keep &= k > q - window
    return keep[None, None]


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, cu_seq_lens_q: torch.Tensor | None = None,
                     sliding_window: int | None = None, softcap: float | None = None, scaling: float | None = None,
                     dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for unused in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(unused, None)
    given = [name for name in _UNSUPPORTED if kwargs.get(name) is not None]
    if given:
        raise ValueError(f"{type(module).__name__} passes {given} to its attention, which rollart's trainer attention "
                         "does not implement" + ("; set train.packing=false" if cu_seq_lens_q is not None else ""))
    if cu_seq_lens_q is None and attention_mask is not None:  # a padded micro-batch: its mask says it all
        if softcap is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                          **kwargs)
        return _eager(module, query, key, value, attention_mask, scaling, softcap, dropout), None
    # a packed row (or rows with no padding and no mask): each sample causal within itself
    bounds = cu_seq_lens_q.tolist() if cu_seq_lens_q is not None else [0, query.shape[2]]
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        q, k, v = query[:, :, a:b], key[:, :, a:b], value[:, :, a:b]
        windowed = sliding_window is not None and b - a > sliding_window
        if softcap is not None:
            parts.append(_eager(module, q, k, v, _band(b - a, sliding_window, q.device), scaling, softcap, dropout))
        elif windowed:
            parts.append(sdpa_attention_forward(module, q, k, v, _band(b - a, sliding_window, q.device),
                                                dropout=dropout, scaling=scaling, **kwargs)[0])
        else:
            parts.append(sdpa_attention_forward(module, q, k, v, None, is_causal=True, dropout=dropout,
                                                scaling=scaling, **kwargs)[0])
    return torch.cat(parts, dim=1), None
