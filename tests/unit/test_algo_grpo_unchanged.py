"""`train.algorithm=grpo` with the defaults is the loss rollart trained with before algorithms became pluggable,
bit for bit: loss, gradient and every statistic it had. The reference is that loss, frozen here as it was
(rollart/algo/losses.py at 9e5b086, `policy_loss` with `importance_weights=True`)."""

import torch

from rollart.algo import PolicyObjective
from rollart.algo.losses import aggregation_weights, policy_loss
from rollart.config import RunConfig


def frozen_policy_loss(logprobs, behaviour_logprobs, advantages, mask, weights, *, clip_low, clip_high, tis_cap,
                       proximal_logprobs=None, ref_logprobs=None, kl_coef=0.0):
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    m = mask.to(logprobs.dtype)
    on = mask.bool()
    prox = logprobs.detach() if proximal_logprobs is None else proximal_logprobs.detach()
    log_ratio = torch.where(on, logprobs - prox, torch.zeros_like(prox))
    log_iw = torch.where(on, prox - behaviour_logprobs, torch.zeros_like(prox))
    ratio = torch.exp(log_ratio)
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
        "ratio_max": (ratio.detach() * m).max(),
        "iw_sum": (iw * m).sum(),
        "iw_max": (raw_iw * m).max(),
        "iw_truncated": ((raw_iw > tis_cap).to(m.dtype) * m).sum(),
        "approx_kl_sum": (0.5 * log_ratio.detach() ** 2 * m).sum(),
        "behaviour_kl_sum": (0.5 * log_iw.detach() ** 2 * m).sum(),
        "pg_loss": pg_loss.detach(),
    }
    if ref_logprobs is not None and kl_coef > 0:
        delta = ref_logprobs - logprobs
        kl_tok = torch.exp(delta) - delta - 1.0
        kl_loss = kl_coef * (wm * kl_tok).sum()
        loss = loss + kl_loss
        stats["ref_kl_sum"] = (kl_tok.detach() * m).sum()
        stats["kl_loss"] = kl_loss.detach()
    return loss, stats


def test_the_default_grpo_loss_is_the_frozen_one_bit_for_bit():
    objective = PolicyObjective.of(RunConfig())
    assert objective.algorithm.name == "grpo" and objective.correction == "token_tis"
    gen = torch.Generator().manual_seed(0)
    for trial in range(120):
        b, t = 1 + trial % 5, 1 + (7 * trial) % 37
        mask = (torch.rand(b, t, generator=gen) > 0.3).long()
        beh = torch.randn(b, t, generator=gen) * 0.5 - 1
        adv = torch.randn(b, generator=gen)
        prox = None if trial % 2 else beh + torch.randn(b, t, generator=gen) * 0.2
        ref = None if trial % 3 else beh + torch.randn(b, t, generator=gen) * 0.1
        kl = 0.0 if ref is None else 0.05
        noise = torch.randn(b, t, generator=gen) * 0.3
        weights = objective.token_weights(mask, float(mask.sum()), float((mask.sum(1) > 0).sum()))
        assert torch.equal(weights, aggregation_weights(mask, "seq_mean"))
        outs = []
        for fn in (frozen_policy_loss, None):
            lp = (beh + noise).requires_grad_()
            if fn is None:
                loss, stats = policy_loss(lp, beh, adv, mask, weights, clip_low=objective.clip_low,
                                          clip_high=objective.clip_high, tis_cap=objective.tis_cap,
                                          surrogate=objective.algorithm.surrogate, correction=objective.correction,
                                          proximal_logprobs=prox, ref_logprobs=ref, kl_coef=kl)
            else:
                loss, stats = fn(lp, beh, adv, mask, weights, clip_low=0.2, clip_high=0.28, tis_cap=2.0,
                                 proximal_logprobs=prox, ref_logprobs=ref, kl_coef=kl)
            loss.backward()
            outs.append((loss.detach(), lp.grad.clone(), stats))
        (l0, g0, s0), (l1, g1, s1) = outs
        assert torch.equal(l0, l1) and torch.equal(g0, g1), trial
        for key, value in s0.items():
            assert torch.equal(value, s1[key]), (trial, key)
