"""The trainer's attention, for any causal LM: packed rows where each sample attends causally to itself only
(varlen attention), and padded micro-batches as transformers' SDPA computes them.

In: transformers' attention call — query/key/value [b, heads, T, d] (key/value may have fewer heads: GQA), the
mask its mask builder made, the layer's `sliding_window` and `softcap` (Gemma 2's attention logit soft-capping)
and `scaling` — plus, for a packed row, the unit boundaries `cu_seq_lens_q` (the keyword flash-attention's
varlen path reads, so the trainer passes the same arguments whichever kernel runs) and, where units share a
prompt, `branch_ids` [1, T]. Out: the attention output
[b, T, heads, d].

Registered with transformers as `ATTENTION` for the trainer's model, with a mask builder of its own: a packed row
comes with no mask at all (`attention_mask=None`), and the builder keeps it so — every model's `create_causal_mask`
and `create_sliding_window_causal_mask` return None for it, whatever the architecture does with masks (Llama,
Mistral, Gemma and Phi build one; Qwen takes a dict of them) — while a padded micro-batch gets SDPA's mask.
A packed row runs SDPA once per sample *length*, causal within each sample — the samples of one length gathered
into a batch of their own and their outputs scattered back into the row, so a micro-batch of many short samples
of few lengths (single-turn tasks: 36 samples of 4 lengths) costs a few SDPA calls per layer, not one per
sample; the cost is each sample's own attention, never a T × T mask over the row (on CPU a masked SDPA would
compute every cross-sample score it then throws away); a
sample longer than its layer's sliding window gets that window as a band within the sample (exactly the mask
transformers builds: a query sees the last `sliding_window` positions, itself included). Units whose samples
share a prompt (trainer/packing.py: the prompt once, then each member's own tokens, `branch_ids` naming each
token's member) run as one masked SDPA per batch of similar lengths (padding at most doubles a batch's scores):
each member sees the prompt and itself, with its own positions' window — what it would compute alone.
Soft-capped attention (which SDPA cannot do) runs as plain matrix products with the same masks, padded or packed.

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


def _similar_lengths(units: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """`units` in batches, longest first, each padded to its longest costing at most twice its own scores."""
    batches: list[list[tuple[int, int]]] = []
    scores = 0
    for unit in sorted(units, key=lambda u: u[0] - u[1]):
        n = unit[1] - unit[0]
        longest = batches[-1][0][1] - batches[-1][0][0] if batches else 0
        if batches and (len(batches[-1]) + 1) * longest * longest <= 2 * (scores + n * n):
            batches[-1].append(unit)
            scores += n * n
        else:
            batches.append([unit])
            scores = n * n
    return batches


def _shared_prompt_units(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         out: torch.Tensor, units: list[tuple[int, int]], branch_ids: torch.Tensor,
                         sliding_window: int | None, softcap: float | None, scaling: float | None, dropout: float,
                         kwargs: dict[str, Any]) -> torch.Tensor:
    """`out` [1, T, heads, d] with the attention of the packed row's units that share a prompt written in.

    The units (of similar lengths), right-padded to the longest, run as one masked SDPA: a token sees the tokens
    before it in its unit that are the shared prompt (branch 0) or its own sample's (the same branch), so each
    member attends exactly as it would alone. A token's position within its sample is the count of what it
    sees, so a sliding window is the same band it would be alone. Padding sits after every real token, so no
    real token sees it (a padded query sees itself: no row is empty)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    device = query.device
    longest = max(b - a for a, b in units)
    starts = torch.tensor([a for a, _ in units], device=device)
    lengths = torch.tensor([b - a for a, b in units], device=device)
    offsets = torch.arange(longest, device=device)
    real = offsets[None, :] < lengths[:, None]  # [n, L]
    where = starts[:, None] + torch.minimum(offsets[None, :], lengths[:, None] - 1)  # pads repeat a real token
    branch = torch.where(real, branch_ids[where], -1)  # [n, L]
    keep = (offsets[None, None, :] <= offsets[None, :, None]) & (
        (branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None]))  # [n, L(query), L(key)]
    if sliding_window is not None:
        position = keep.sum(-1) - 1  # [n, L]: each token's position in its own sample
        keep &= position[:, None, :] > position[:, :, None] - sliding_window
    mask = keep[:, None]  # [n, 1, L, L]
    flat = where.reshape(-1)
    q, k, v = (t[0].index_select(1, flat).unflatten(1, (len(units), longest)).transpose(0, 1)
               for t in (query, key, value))  # [n, h, L, d]
    if softcap is not None:
        attended = _eager(module, q, k, v, mask, scaling, softcap, dropout)
    else:
        attended = sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling, **kwargs)[0]
    keep_rows = real.reshape(-1)
    return out.index_copy(1, flat[keep_rows], attended.reshape(1, -1, *attended.shape[2:])[:, keep_rows])


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, cu_seq_lens_q: torch.Tensor | None = None,
                     sliding_window: int | None = None, softcap: float | None = None, scaling: float | None = None,
                     dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for unused in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(unused, None)
    branch_ids = kwargs.pop("branch_ids", None)
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

    def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention of [n, h, L, d] samples of one length L, each causal within itself: [n, L, h, d]."""
        width = q.shape[2]
        if softcap is not None:
            return _eager(module, q, k, v, _band(width, sliding_window, q.device), scaling, softcap, dropout)
        if sliding_window is not None and width > sliding_window:
            return sdpa_attention_forward(module, q, k, v, _band(width, sliding_window, q.device), dropout=dropout,
                                          scaling=scaling, **kwargs)[0]
        return sdpa_attention_forward(module, q, k, v, None, is_causal=True, dropout=dropout, scaling=scaling,
                                      **kwargs)[0]

    bounds = cu_seq_lens_q.tolist() if cu_seq_lens_q is not None else [0, query.shape[2]]
    units = list(zip(bounds[:-1], bounds[1:]))
    trees: list[tuple[int, int]] = []
    if branch_ids is not None:  # a unit whose last token is a member's own shares a prompt (trainer/packing.py)
        last = branch_ids[0, torch.tensor(bounds[1:], device=branch_ids.device) - 1].tolist()
        trees = [unit for unit, branch in zip(units, last) if branch]
        units = [unit for unit, branch in zip(units, last) if not branch]
    by_length: dict[int, list[int]] = {}
    for a, b in units:
        by_length.setdefault(b - a, []).append(a)
    if not trees and (query.shape[0] != 1 or len(by_length) == len(units)):  # nothing to gather: sample by sample
        return torch.cat([causal(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b]) for a, b in units], dim=1), None
    out = query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])  # [1, T, heads, d]
    for batch in _similar_lengths(trees):
        out = _shared_prompt_units(module, query, key, value, out, batch, branch_ids[0], sliding_window, softcap,
                                   scaling, dropout, kwargs)
    for length, starts in by_length.items():
        # the n samples of this length: their positions in the row, and [1, h, T, d] → [n, h, length, d]
        where = (torch.tensor(starts, device=query.device)[:, None]
                 + torch.arange(length, device=query.device)).view(-1)
        q, k, v = (t[0].index_select(1, where).unflatten(1, (len(starts), length)).transpose(0, 1)
                   for t in (query, key, value))
        out = out.index_copy(1, where, causal(q, k, v).reshape(1, -1, query.shape[1], query.shape[3]))
    return out, None
