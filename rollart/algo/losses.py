"""The policy-gradient loss: clipped decoupled PPO with truncated importance weights, optional k3 KL.

In (all [B, T], one entry per predicted token; `advantages` may be [B]): the current log-probabilities
log π_θ (with grad), the behaviour log-probabilities log μ the inference engine recorded when it sampled
each token (a trajectory may mix several policy versions: every token carries the logprob of the version
that produced it), the loss mask m (1 on the model's own tokens only — prompts and observations are 0) and
aggregation weights ω (`aggregation_weights`). Out: a scalar loss and summed statistics.

Decoupled PPO (Hilton et al. 2022; AReaL): the trust region is measured against a *proximal* policy
π_prox — the weights before this update — while the off-policy gap between π_prox and the behaviour
policies is corrected with an importance weight, truncated at C = `train.tis_cap` (TIS):

    r_t  = exp(log π_θ − log π_prox)                      (proximal ratio; = 1 in value at the first step)
    w_t  = min(exp(log π_prox − log μ), C)                (behaviour correction, detached)
    s_t  = min(r_t·A, clip(r_t, 1 − ε_low, 1 + ε_high)·A)  (asymmetric clip: ε_low = clip_low, ε_high = clip_high)
    k3_t = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1          (Schulman's k3 KL estimator)
    ℓ_t  = −w_t·s_t + β·k3_t                              (β = `train.kl_coef`)
    L    = Σ_t ω_t · m_t · ℓ_t

With one optimizer step per batch π_prox is the detached current policy (`proximal_logprobs=None`): no
extra forward pass, r_t = 1 in value (so nothing is clipped) and ∇L = −Σ ω·m·w·A·∇log π_θ — importance-
corrected REINFORCE against the exact per-token behaviour versions. Pass `proximal_logprobs` when several
optimizer steps reuse one batch; then the clip is active.

Aggregation (`aggregation_weights`): token_mean ω_t = 1/N_tok (all model tokens of the global batch),
seq_mean ω_t = 1/(N_seq · n_tok(seq)). Pass the global totals when a batch is split over micro-batches and
data-parallel ranks: the sum of the micro-batch losses is then exactly the loss of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

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
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = Σ ω·m·(−w·s + β·k3) (module docstring). Returns (loss, stats).

    stats are sums over masked tokens, so micro-batches and ranks add up: `tokens`, `clipped`
    (tokens whose clipped branch was taken), `iw_sum` (applied, truncated weights), `iw_max` (raw weight
    before truncation),
    `iw_truncated` (tokens with raw weight > C), `approx_kl_sum` (½(log π_θ − log μ)², behaviour → current),
    `ref_kl_sum` (k3, when a reference is given), `pg_loss` / `kl_loss` (the two weighted parts of L).
    """
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    m = mask.to(logprobs.dtype)
    prox = logprobs.detach() if proximal_logprobs is None else proximal_logprobs.detach()
    ratio = torch.exp(logprobs - prox)
    # Padding positions may hold any logprob; zero the exponent there so no inf leaks into the sums.
    log_iw = torch.where(mask.bool(), prox - behaviour_logprobs, torch.zeros_like(prox))
    raw_iw = torch.exp(log_iw).detach()
    iw = raw_iw.clamp(max=tis_cap)
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
        "iw_sum": (raw_iw.clamp(max=tis_cap) * m).sum(),
        "iw_max": (raw_iw * m).max() if m.numel() else torch.zeros(()),
        "iw_truncated": ((raw_iw > tis_cap).to(m.dtype) * m).sum(),
        "approx_kl_sum": (0.5 * (logprobs.detach() - behaviour_logprobs) ** 2 * m).sum(),
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
    """`policy_loss` bound to the `train.*` coefficients: what the driver hands the trainer.

    The trainer calls `token_weights(mask, total_tokens, total_seqs)` per micro-batch with the global
    totals, then `objective(logprobs, behaviour_logprobs, advantages, mask, weights, ref_logprobs)`.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    aggregation: Aggregation = "token_mean"

    @classmethod
    def from_config(cls, train: TrainConfig) -> PolicyObjective:
        return cls(train.clip_low, train.clip_high, train.tis_cap, train.kl_coef, train.aggregation)

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0

    def token_weights(self, mask: Tensor, total_tokens: float, total_seqs: float) -> Tensor:
        return aggregation_weights(mask, self.aggregation, total_tokens, total_seqs)

    def __call__(
        self,
        logprobs: Tensor,
        behaviour_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        weights: Tensor,
        ref_logprobs: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return policy_loss(
            logprobs, behaviour_logprobs, advantages, mask, weights,
            clip_low=self.clip_low, clip_high=self.clip_high, tis_cap=self.tis_cap,
            ref_logprobs=ref_logprobs, kl_coef=self.kl_coef,
        )
