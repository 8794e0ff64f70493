"""The behaviour correction w and the measurement of the mismatch it corrects (pure tensor functions).

In: log(π_prox/μ) per token [B, T] — the trainer's log-probability of each generated token at the proximal
policy minus the engine's (the behaviour policy μ: an older version, or the same weights on another
engine) — the loss mask, `train.correction`, and the bounds C_max = `train.tis_cap`, C_min = `train.tis_floor`.
Out: the weight w_t (detached) each token's policy-gradient term is multiplied by, and which tokens were
truncated or masked; a log-space histogram of the raw ratios (it sums across micro-batches and ranks) and
quantiles read from it.

    token_tis   w_t = clip(ρ_t, C_min, C_max)                 ρ_t = π_prox(t)/μ(t)
    token_mis   w_t = ρ_t if C_min ≤ ρ_t ≤ C_max, else 0      (the token drops out of the gradient)
    seq_tis     w_t = clip(ρ_seq, C_min, C_max)               ρ_seq = Π_t ρ_t over the sequence's model tokens
    seq_mis     w_t = ρ_seq if C_min ≤ ρ_seq ≤ C_max, else 0  (the whole sequence drops out)
    none        w_t = 1

C_min = 0 is one-sided (only the cap acts); C_min > 0 with a mis mode is the two-sided mask of icepop. These
are TRL's `vllm_importance_sampling_mode` token_truncate / token_mask / sequence_truncate / sequence_mask
with `vllm_importance_sampling_clip_min/max`.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

Correction = Literal["none", "token_tis", "token_mis", "seq_tis", "seq_mis"]
HIST_BINS = 256
HIST_LOG_RANGE = 8.0  # the histogram spans log ρ ∈ [−8, 8]; outside, values land in the end bins


class CorrectionWeights(NamedTuple):
    weight: Tensor  # w_t [B, T], detached
    truncated: Tensor  # [B, T] bool: the weight was cut to a bound (tis modes)
    masked: Tensor  # [B, T] bool: the weight was set to 0 (mis modes)


def correction_weights(log_ratio: Tensor, mask: Tensor, mode: Correction, cap: float, floor: float = 0.0
                       ) -> CorrectionWeights:
    """w_t for `mode` (module docstring); `log_ratio` = log π_prox − log μ, 0 off the mask."""
    log_ratio = log_ratio.detach()
    none = torch.zeros_like(log_ratio, dtype=torch.bool)
    if mode == "none":
        return CorrectionWeights(torch.ones_like(log_ratio), none, none)
    on = mask.bool()
    if mode in ("seq_tis", "seq_mis"):
        per_seq = (log_ratio * on.to(log_ratio.dtype)).sum(dim=-1, keepdim=True)
        rho = torch.exp(per_seq).expand_as(log_ratio)
    elif mode in ("token_tis", "token_mis"):
        rho = torch.exp(log_ratio)
    else:
        raise ValueError(f"train.correction={mode!r} is not one of none, token_tis, token_mis, seq_tis, seq_mis")
    outside = ((rho > cap) | (rho < floor)) & on
    if mode.endswith("_tis"):
        weight = rho.clamp(max=cap) if floor == 0 else rho.clamp(min=floor, max=cap)
        return CorrectionWeights(weight, outside, none)
    return CorrectionWeights(torch.where(outside, torch.zeros_like(rho), rho), none, outside)


def log_ratio_histogram(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """Counts [HIST_BINS] (float64) of the masked tokens' log ρ over [−8, 8] (outside: the end bins)."""
    values = log_ratio.detach()[mask.bool()].to(torch.float64)
    width = 2 * HIST_LOG_RANGE / HIST_BINS
    index = ((values + HIST_LOG_RANGE) / width).floor().clamp(0, HIST_BINS - 1).long()
    return torch.zeros(HIST_BINS, dtype=torch.float64).index_add_(0, index, torch.ones_like(values))


def histogram_quantile(counts: Tensor, q: float) -> float:
    """The q-quantile of ρ from `log_ratio_histogram` counts (linear within a bin, in log space): exact to a
    bin's width, e^(1/16) ≈ ±6% of ρ; NaN when the histogram is empty."""
    counts = counts.to(torch.float64)
    total = float(counts.sum())
    if total <= 0:
        return math.nan
    target = q * total
    cumulative = torch.cumsum(counts, 0)
    k = int(torch.searchsorted(cumulative, torch.tensor(target, dtype=torch.float64)).clamp(max=HIST_BINS - 1))
    before = float(cumulative[k - 1]) if k > 0 else 0.0
    inside = float(counts[k])
    frac = (target - before) / inside if inside > 0 else 0.0
    width = 2 * HIST_LOG_RANGE / HIST_BINS
    return math.exp(-HIST_LOG_RANGE + (k + min(max(frac, 0.0), 1.0)) * width)
