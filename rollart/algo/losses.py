"""The policy-gradient loss: clipped decoupled PPO with truncated importance weights, optional k3 KL.

In (all [B, T], one entry per predicted token; `advantages` may be [B]): the current log-probabilities
log π_θ (with grad), the behaviour log-probabilities log μ the inference engine recorded when it sampled
each token (a trajectory may mix several policy versions: every token carries the logprob of the version
that produced it), the proximal log-probabilities log π_prox, the loss mask m (1 on the model's own tokens
only — prompts and observations are 0) and aggregation weights ω (`aggregation_weights`). Out: a scalar
loss and summed statistics.

Decoupled PPO (Hilton et al. 2022; AReaL): the trust region is measured against a *proximal* policy
π_prox — the trainer's weights before the first optimizer step on this batch, computed once per batch —
while the off-policy gap between π_prox and the behaviour policies is corrected by an importance weight
truncated at C = `train.tis_cap` (TIS):

    r_t  = exp(log π_θ − log π_prox)                      (proximal ratio; 1 at the batch's first step)
    w_t  = min(exp(log π_prox − log μ), C)                (behaviour correction, detached)
    s_t  = min(r_t·A, clip(r_t, 1 − ε_low, 1 + ε_high)·A)  (asymmetric clip: ε_low = clip_low, ε_high = clip_high)
    k3_t = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1          (Schulman's k3 KL estimator)
    ℓ_t  = −w_t·s_t + β·k3_t                              (β = `train.kl_coef`)
    L    = Σ_t ω_t · m_t · ℓ_t

`train.importance_weights=false` sets w_t = 1: the gap between behaviour and proximal policy is ignored
(the ablation of the staleness benchmark).

The clipped branch is taken (the token's gradient is zero) only when r_t has left the band in the
direction the advantage pushes: r_t > 1 + ε_high with A > 0, or r_t < 1 − ε_low with A < 0.

A batch is trained in `train.mini_batches` × `train.epochs` optimizer steps (`updates.mini_batch_plan`);
ω is normalised per mini-batch. With one step per batch π_prox is the detached current policy
(`proximal_logprobs=None`): no extra forward pass, r_t = 1 in value (nothing is clipped) and
∇L = −Σ ω·m·w·A·∇log π_θ — importance-corrected REINFORCE against the exact per-token behaviour versions.

Aggregation (`aggregation_weights`): token_mean ω_t = 1/N_tok (all model tokens of the mini-batch),
seq_mean ω_t = 1/(N_seq · n_tok(seq)). Pass the mini-batch's totals when it is split over micro-batches and
data-parallel ranks: the sum of the micro-batch losses is then exactly the loss of the whole mini-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from rollart.algo.updates import mini_batch_plan
from rollart.config import TrainConfig

Aggregation = Literal["token_mean", "seq_mean"]


def aggregation_weights(
    mask: Tensor, aggregation: Aggregation, total_tokens: float | None = None, total_seqs: float | None = None
) -> Tensor:
    """ω [B, T]: token_mean 1/N_tok, seq_mean 1/(N_seq·n_tok(seq)); zero where `mask` is 0.

    Defaults: N_tok = mask.sum(), N_seq = sequences of this batch with at least one model token.
    """
    m = mask.to(torch.float64)
    if aggregation == "token_mean":
        n = float(m.sum()) if total_tokens is None else float(total_tokens)
        return (m / max(n, 1.0)).to(torch.float32)
    if aggregation == "seq_mean":
        per_seq = m.sum(dim=1, keepdim=True)
        n = float((per_seq > 0).sum()) if total_seqs is None else float(total_seqs)
        return (m / (per_seq.clamp(min=1.0) * max(n, 1.0))).to(torch.float32)
    raise ValueError(f"train.aggregation={aggregation!r} is not one of 'token_mean', 'seq_mean'")


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref): exp(Δ) − Δ − 1 with Δ = log π_ref − log π_θ (≥ 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


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
    proximal_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    importance_weights: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = Σ ω·m·(−w·s + β·k3) (module docstring). Returns (loss, stats).

    stats are sums (or maxima) over masked tokens, so micro-batches, ranks and optimizer steps add up:
    `tokens`; `clipped` (tokens whose clipped branch was taken); `ratio_max` (largest r_t);
    `iw_sum` (applied, truncated weights w_t); `iw_max` (largest weight before truncation);
    `iw_truncated` (tokens whose applied weight was cut to C); `approx_kl_sum` (½(log π_θ − log π_prox)²: how far
    this batch's updates have moved the policy); `behaviour_kl_sum` (½(log π_prox − log μ)²: the
    off-policy gap the weights correct); `ref_kl_sum` (k3, when a reference is given); `pg_loss` /
    `kl_loss` (the two weighted parts of L).
    """
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    m = mask.to(logprobs.dtype)
    on = mask.bool()
    prox = logprobs.detach() if proximal_logprobs is None else proximal_logprobs.detach()
    # Padding positions may hold any logprob; zero the exponents there so no inf leaks into the sums.
    log_ratio = torch.where(on, logprobs - prox, torch.zeros_like(prox))
    log_iw = torch.where(on, prox - behaviour_logprobs, torch.zeros_like(prox))
    ratio = torch.exp(log_ratio)
    raw_iw = torch.exp(log_iw).detach()
    iw = raw_iw.clamp(max=tis_cap) if importance_weights else torch.ones_like(raw_iw)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    surrogate = torch.minimum(unclipped, clipped)
    pg_tok = -iw * surrogate
    wm = weights * m
    pg_loss = (wm * pg_tok).sum()
    loss = pg_loss
    stats = {
        "tokens": m.sum().detach(),
        "clipped": ((clipped < unclipped).to(m.dtype) * m).sum().detach(),
        "ratio_max": (ratio.detach() * m).max() if m.numel() else torch.zeros(()),
        "iw_sum": (iw * m).sum(),
        "iw_max": (raw_iw * m).max() if m.numel() else torch.zeros(()),
        "iw_truncated": ((raw_iw > tis_cap).to(m.dtype) * m).sum() if importance_weights else torch.zeros(()),
        "approx_kl_sum": (0.5 * log_ratio.detach() ** 2 * m).sum(),
        "behaviour_kl_sum": (0.5 * log_iw.detach() ** 2 * m).sum(),
        "pg_loss": pg_loss.detach(),
    }
    if ref_logprobs is not None and kl_coef > 0:
        kl_tok = k3_kl(logprobs, ref_logprobs)
        kl_loss = kl_coef * (wm * kl_tok).sum()
        loss = loss + kl_loss
        stats["ref_kl_sum"] = (kl_tok.detach() * m).sum()
        stats["kl_loss"] = kl_loss.detach()
    return loss, stats


@dataclass(frozen=True)
class PolicyObjective:
    """`policy_loss` and the update plan bound to the `train.*` settings: what the driver hands the trainer.

    Per batch the trainer asks `update_plan(num_samples, seed)` for its optimizer steps; when there is more
    than one it computes π_prox once, before the first. Per micro-batch it calls
    `token_weights(mask, total_tokens, total_seqs)` with the mini-batch's totals, then
    `objective(logprobs, behaviour_logprobs, advantages, mask, weights, proximal_logprobs, ref_logprobs)`.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    aggregation: Aggregation = "token_mean"
    mini_batches: int = 1
    epochs: int = 1
    importance_weights: bool = True

    @classmethod
    def from_config(cls, train: TrainConfig) -> PolicyObjective:
        return cls(train.clip_low, train.clip_high, train.tis_cap, train.kl_coef, train.aggregation,
                   train.mini_batches, train.epochs, train.importance_weights)

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0

    def update_plan(self, num_samples: int, seed: str) -> list[tuple[int, ...]]:
        return mini_batch_plan(num_samples, self.mini_batches, self.epochs, seed)

    def token_weights(self, mask: Tensor, total_tokens: float, total_seqs: float) -> Tensor:
        return aggregation_weights(mask, self.aggregation, total_tokens, total_seqs)

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
        return policy_loss(
            logprobs, behaviour_logprobs, advantages, mask, weights,
            clip_low=self.clip_low, clip_high=self.clip_high, tis_cap=self.tis_cap,
            proximal_logprobs=proximal_logprobs, ref_logprobs=ref_logprobs, kl_coef=self.kl_coef,
            importance_weights=self.importance_weights,
        )
