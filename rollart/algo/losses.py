"""The policy-gradient loss every algorithm shares: decoupled PPO around the algorithm's surrogate, with the
behaviour correction, a KL penalty and aggregation weights (pure tensor functions).

In (all [B, T], one entry per predicted token; `advantages` may be [B]): the current log-probabilities
log π_θ (with grad), the behaviour log-probabilities log μ the inference engine recorded when it sampled
each token (a trajectory may mix several policy versions: every token carries the logprob of the version
that produced it), the proximal log-probabilities log π_prox, the loss mask m (1 on the model's own tokens
only — prompts and observations are 0) and aggregation weights ω (`aggregation_weights`), the algorithm's
surrogate (algorithm.py). Out: a scalar loss and summed statistics.

Decoupled PPO (Hilton et al. 2022; AReaL): the trust region is measured against a *proximal* policy π_prox
— the trainer's weights before the first optimizer step on this batch, computed once per batch — while the
off-policy gap between π_prox and the behaviour policies is corrected by a weight w_t (`train.correction`,
corrections.py; default token_tis: min(π_prox/μ, C)):

    Δ_t  = log π_θ − log π_prox                           (0 at the batch's first step)
    s_t  = surrogate(Δ, A)                                (grpo: min(r·A, clip(r, 1−ε_low, 1+ε_high)·A), r = e^Δ)
    w_t  = correction(π_prox/μ)                           (detached)
    ℓ_t  = −w_t·s_t + β·KL_t                              (β = `train.kl_coef`; KL_t by `train.kl_estimator`)
    L    = Σ_t ω_t · m_t · ℓ_t

KL estimators (Schulman, "Approximating KL divergence"), with δ = log π_ref − log π_θ: k1 = −δ, k2 = δ²/2,
k3 = e^δ − δ − 1 (unbiased, ≥ 0; the default).

A batch is trained in `train.mini_batches` × `train.epochs` optimizer steps (`updates.mini_batch_plan`);
ω is normalised per mini-batch. With one step per batch π_prox is the detached current policy
(`proximal_logprobs=None`): no extra forward pass, r_t = 1 in value (nothing is clipped) and
∇L = −Σ ω·m·w·A·∇log π_θ — importance-corrected REINFORCE against the exact per-token behaviour versions.

Aggregation (`aggregation_weights`), with N_tok the model tokens and N_seq the sequences of the mini-batch:
token_mean ω = 1/N_tok; seq_mean ω = 1/(N_seq·n_tok(seq)); seq_sum ω = 1/N_seq; seq_sum_norm ω = 1/(N_seq·L)
(L a constant: Dr.GRPO). Pass the mini-batch's totals when it is split over micro-batches and data-parallel
ranks: the sum of the micro-batch losses is then exactly the loss of the whole mini-batch.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rollart.algo.algorithm import Surrogate
from rollart.algo.corrections import Correction, correction_weights, log_ratio_histogram
from rollart.algo.grpo import token_clip

Aggregation = Literal["token_mean", "seq_mean", "seq_sum", "seq_sum_norm"]
KlEstimator = Literal["k3", "k2", "k1"]


def aggregation_weights(mask: Tensor, aggregation: Aggregation, total_tokens: float | None = None,
                        total_seqs: float | None = None, norm_length: float = 1.0) -> Tensor:
    """ω [B, T] (module docstring); zero where `mask` is 0.

    Defaults: N_tok = mask.sum(), N_seq = sequences of this batch with at least one model token.
    """
    m = mask.to(torch.float64)
    if aggregation == "token_mean":
        n = float(m.sum()) if total_tokens is None else float(total_tokens)
        return (m / max(n, 1.0)).to(torch.float32)
    per_seq = m.sum(dim=1, keepdim=True)
    n = float((per_seq > 0).sum()) if total_seqs is None else float(total_seqs)
    if aggregation == "seq_mean":
        return (m / (per_seq.clamp(min=1.0) * max(n, 1.0))).to(torch.float32)
    if aggregation == "seq_sum":
        return (m / max(n, 1.0)).to(torch.float32)
    if aggregation == "seq_sum_norm":
        return (m / (max(n, 1.0) * max(norm_length, 1.0))).to(torch.float32)
    raise ValueError(f"train.aggregation={aggregation!r} is not one of 'token_mean', 'seq_mean', 'seq_sum', "
                     "'seq_sum_norm'")


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref): exp(δ) − δ − 1 with δ = log π_ref − log π_θ (≥ 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: KlEstimator = "k3") -> Tensor:
    """The per-token KL penalty of `train.kl_estimator` (module docstring)."""
    if estimator == "k3":
        return k3_kl(logprobs, ref_logprobs)
    delta = ref_logprobs - logprobs
    if estimator == "k2":
        return 0.5 * delta**2
    if estimator == "k1":
        return -delta
    raise ValueError(f"train.kl_estimator={estimator!r} is not one of 'k3', 'k2', 'k1'")


def policy_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    tis_cap: float,
    tis_floor: float = 0.0,
    correction: Correction = "token_tis",
    surrogate: Surrogate = token_clip,
    proximal_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KlEstimator = "k3",
    fresh: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = Σ ω·m·(−w·s + β·KL) (module docstring). Returns (loss, stats).

    stats are sums (keys ending in `_max`: maxima; `_hist`: count vectors) over masked tokens, so
    micro-batches, ranks and optimizer steps add up: `tokens`; `clipped` (tokens whose clipped branch was
    taken); `ratio_max` (largest ratio the surrogate used); `iw_sum` (applied weights w_t); `iw_max` (largest
    token ratio π_prox/μ before the correction); `iw_truncated` / `iw_masked` (tokens whose weight was cut to a
    bound / set to 0); `iw_hist` (histogram of log π_prox/μ); `approx_kl_sum` (½(log π_θ − log π_prox)²: how
    far this batch's updates have moved the policy); `behaviour_kl_sum` (½(log π_prox − log μ)²: the off-policy
    gap the weights correct); `mismatch_kl_sum` / `mismatch_tokens` (k3 KL(μ ‖ π_prox) over the tokens `fresh`
    marks — generated by the version being trained, so the gap is the engine's, not staleness); `ref_kl_sum`
    (k3, when a reference is given); `pg_loss` / `kl_loss` (the two weighted parts of L).
    """
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    m = mask.to(logprobs.dtype)
    on = mask.bool()
    prox = logprobs.detach() if proximal_logprobs is None else proximal_logprobs.detach()
    # Padding positions may hold any logprob; zero the exponents there so no inf leaks into the sums.
    log_ratio = torch.where(on, logprobs - prox, torch.zeros_like(prox))
    log_iw = torch.where(on, prox - behaviour_logprobs, torch.zeros_like(prox))
    raw_iw = torch.exp(log_iw).detach()
    w = correction_weights(log_iw, mask, correction, tis_cap, tis_floor)
    terms = surrogate(logprobs, log_ratio, advantages, mask, clip_low, clip_high)
    pg_tok = -w.weight * terms.objective
    wm = weights * m
    pg_loss = (wm * pg_tok).sum()
    loss = pg_loss
    fresh_m = m if fresh is None else m * fresh.to(m.dtype)
    stats = {
        "tokens": m.sum().detach(),
        "clipped": (terms.clipped.to(m.dtype) * m).sum().detach(),
        "ratio_max": (terms.ratio * m).max() if m.numel() else torch.zeros(()),
        "iw_sum": (w.weight * m).sum(),
        "iw_max": (raw_iw * m).max() if m.numel() else torch.zeros(()),
        "iw_truncated": (w.truncated.to(m.dtype) * m).sum(),
        "iw_masked": (w.masked.to(m.dtype) * m).sum(),
        "iw_hist": log_ratio_histogram(log_iw, mask),
        "approx_kl_sum": (0.5 * log_ratio.detach() ** 2 * m).sum(),
        "behaviour_kl_sum": (0.5 * log_iw.detach() ** 2 * m).sum(),
        "mismatch_kl_sum": ((raw_iw - 1.0 - log_iw.detach()) * fresh_m).sum(),
        "mismatch_tokens": fresh_m.sum().detach(),
        "pg_loss": pg_loss.detach(),
    }
    if ref_logprobs is not None and kl_coef > 0:
        kl_tok = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        kl_loss = kl_coef * (wm * kl_tok).sum()
        loss = loss + kl_loss
        stats["ref_kl_sum"] = (k3_kl(logprobs.detach(), ref_logprobs) * m).sum()
        stats["kl_loss"] = kl_loss.detach()
    return loss, stats
