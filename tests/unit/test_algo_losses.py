"""The policy loss equals the hand computation: clipping, TIS truncation, KL, both aggregations, grads."""

import math

import pytest
import torch

from rollart.algo import PolicyObjective, aggregation_weights, k3_kl, mini_batch_plan, policy_loss
from rollart.config import RunConfig, TrainConfig


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


def test_aggregation_weights_token_and_seq_mean():
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 0]])
    tok = aggregation_weights(mask, "token_mean")
    close(tok, [[0, 0.25, 0.25, 0.25], [0, 0, 0.25, 0]])
    seq = aggregation_weights(mask, "seq_mean")
    close(seq, [[0, 1 / 6, 1 / 6, 1 / 6], [0, 0, 0.5, 0]])
    # global totals (a micro-batch of a bigger batch): 10 tokens, 5 sequences
    assert aggregation_weights(mask, "token_mean", 10, 5)[0, 1].item() == pytest.approx(0.1)
    assert aggregation_weights(mask, "seq_mean", 10, 5)[1, 2].item() == pytest.approx(0.2)
    with pytest.raises(ValueError, match="train.aggregation"):
        aggregation_weights(mask, "sum")  # type: ignore[arg-type]


def _hand_token_loss(lp, prox, beh, adv, lo, hi, cap):
    r = math.exp(lp - prox)
    w = min(math.exp(prox - beh), cap)
    return -w * min(r * adv, min(max(r, 1 - lo), 1 + hi) * adv)


def test_clipped_loss_with_proximal_and_tis_matches_hand_computation():
    lo, hi, cap = 0.2, 0.28, 2.0
    # token 0: ratio 1.5, A>0 -> clipped at 1.28; token 1: ratio 0.5, A<0 -> clipped at 0.8;
    # token 2: ratio 0.9 unclipped; token 3: prompt (masked). Behaviour of token 1 far below -> w truncated.
    prox = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    lp = prox + torch.log(torch.tensor([[1.5, 0.5, 0.9, 7.0]]))
    beh = torch.tensor([[-1.1, -3.5, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv_seq = torch.tensor([1.0])
    adv_tok = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    for aggregation in ("token_mean", "seq_mean"):
        w = aggregation_weights(mask, aggregation)
        loss, stats = policy_loss(
            lp, beh, adv_tok, mask, w, clip_low=lo, clip_high=hi, tis_cap=cap, proximal_logprobs=prox
        )
        hand = [
            _hand_token_loss(lp[0, i].item(), prox[0, i].item(), beh[0, i].item(), adv_tok[0, i].item(), lo, hi, cap)
            for i in range(3)
        ]
        assert loss.item() == pytest.approx(sum(hand) / 3, rel=1e-6)
        assert stats["clipped"].item() == 2
        assert stats["iw_truncated"].item() == 1
        assert stats["iw_max"].item() == pytest.approx(math.exp(1.5), rel=1e-6)
        assert stats["iw_sum"].item() == pytest.approx(math.exp(0.1) + 2.0 + 1.0, rel=1e-6)
        assert stats["tokens"].item() == 3
    # [B] advantages broadcast over tokens
    loss_b, _ = policy_loss(lp, beh, adv_seq, mask, aggregation_weights(mask, "token_mean"),
                            clip_low=lo, clip_high=hi, tis_cap=cap, proximal_logprobs=prox)
    hand_b = [_hand_token_loss(lp[0, i].item(), prox[0, i].item(), beh[0, i].item(), 1.0, lo, hi, cap)
              for i in range(3)]
    assert loss_b.item() == pytest.approx(sum(hand_b) / 3, rel=1e-6)


def test_seq_mean_differs_from_token_mean_by_hand():
    lp = torch.zeros(2, 3)
    beh = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    kw = dict(clip_low=0.2, clip_high=0.2, tis_cap=2.0)
    tok, _ = policy_loss(lp, beh, adv, mask, aggregation_weights(mask, "token_mean"), **kw)
    seq, _ = policy_loss(lp, beh, adv, mask, aggregation_weights(mask, "seq_mean"), **kw)
    assert tok.item() == pytest.approx(-(1 + 1 + 1 - 2) / 4)
    assert seq.item() == pytest.approx(-(1.0 + -2.0) / 2)


def test_first_step_gradient_is_importance_weighted_reinforce():
    """Proximal = detached current: ∂L/∂logπ_t = −ω_t·m_t·min(exp(logπ−logμ), C)·A."""
    lp = torch.tensor([[-0.3, -1.2, -0.7]], requires_grad=True)
    beh = torch.tensor([[-0.3, -2.5, -0.2]])
    mask = torch.tensor([[1, 1, 0]])
    w = aggregation_weights(mask, "token_mean")
    loss, stats = policy_loss(lp, beh, torch.tensor([2.0]), mask, w, clip_low=0.2, clip_high=0.28, tis_cap=2.0)
    loss.backward()
    expected = [-0.5 * 1.0 * 2.0, -0.5 * min(math.exp(1.3), 2.0) * 2.0, 0.0]
    assert lp.grad.tolist()[0] == pytest.approx(expected, rel=1e-6)
    assert stats["clipped"].item() == 0  # ratio is 1 at the proximal point
    assert stats["behaviour_kl_sum"].item() == pytest.approx(0.5 * 1.3**2, rel=1e-6)
    assert stats["approx_kl_sum"].item() == 0.0 and stats["ratio_max"].item() == 1.0


def test_k3_kl_and_kl_term():
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    k3 = k3_kl(lp, ref)
    assert k3.tolist()[0] == pytest.approx([math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1])
    mask = torch.ones(1, 2)
    w = aggregation_weights(mask, "token_mean")
    kw = dict(clip_low=0.2, clip_high=0.28, tis_cap=2.0)
    base, _ = policy_loss(lp, lp, torch.tensor([0.0]), mask, w, **kw)
    with_kl, stats = policy_loss(lp, lp, torch.tensor([0.0]), mask, w, ref_logprobs=ref, kl_coef=0.1, **kw)
    assert base.item() == 0.0
    assert with_kl.item() == pytest.approx(0.1 * k3.sum().item() / 2, rel=1e-6)
    assert stats["ref_kl_sum"].item() == pytest.approx(k3.sum().item(), rel=1e-6)


def test_padding_never_leaks_inf():
    lp = torch.tensor([[-1.0, 0.0]])
    beh = torch.tensor([[-1.0, -1e9]])  # garbage at a padded position
    mask = torch.tensor([[1, 0]])
    loss, stats = policy_loss(lp, beh, torch.tensor([1.0]), mask, aggregation_weights(mask, "token_mean"),
                              clip_low=0.2, clip_high=0.2, tis_cap=2.0)
    assert math.isfinite(loss.item()) and stats["iw_max"].item() == 1.0


def test_objective_binds_the_coefficients():
    obj = PolicyObjective.of(RunConfig(train=TrainConfig(clip_low=0.1, clip_high=0.3, tis_cap=3.0, kl_coef=0.05,
                                                         aggregation="seq_mean")))
    assert (obj.clip_low, obj.clip_high, obj.tis_cap, obj.kl_coef, obj.aggregation) == (0.1, 0.3, 3.0, 0.05, "seq_mean")
    assert obj.uses_reference
    mask = torch.tensor([[1, 1]])
    close(obj.token_weights(mask, 4, 2), [[0.25, 0.25]])


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_the_clip_is_taken_exactly_when_the_ratio_leaves_the_band(advantage):
    """r > 1 + ε_high with A > 0, or r < 1 − ε_low with A < 0: the clipped branch, zero gradient; else the
    unclipped branch (PPO's pessimism also keeps it when r leaves the band the other way)."""
    lo, hi = 0.2, 0.28
    ratios = [0.5, 0.79, 0.81, 1.0, 1.27, 1.29, 2.0]
    prox = torch.full((1, len(ratios)), -1.0)
    lp = (prox + torch.log(torch.tensor([ratios]))).requires_grad_(True)
    mask = torch.ones_like(prox)
    loss, stats = policy_loss(lp, prox, torch.tensor([advantage]), mask, aggregation_weights(mask, "token_mean"),
                              clip_low=lo, clip_high=hi, tis_cap=2.0, proximal_logprobs=prox)
    loss.backward()
    outside = [(r > 1 + hi) if advantage > 0 else (r < 1 - lo) for r in ratios]
    assert stats["clipped"].item() == sum(outside) == 2
    for r, out, g in zip(ratios, outside, lp.grad[0].tolist()):
        assert (g == 0.0) == out, (r, g)
    assert stats["ratio_max"].item() == pytest.approx(2.0, rel=1e-6)
    assert stats["approx_kl_sum"].item() == pytest.approx(sum(0.5 * math.log(r) ** 2 for r in ratios), rel=1e-5)


def test_proximal_equal_to_the_current_policy_is_the_one_step_objective():
    """Passing π_prox = the detached current policy gives exactly the `proximal_logprobs=None` loss and grads."""
    beh = torch.tensor([[-0.3, -2.5, -0.2, -1.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = aggregation_weights(mask, "seq_mean")
    out = []
    for prox in (None, "current"):
        lp = torch.tensor([[-0.4, -1.2, -0.7, -5.0]], requires_grad=True)
        loss, stats = policy_loss(lp, beh, torch.tensor([-1.5]), mask, w, clip_low=0.2, clip_high=0.28, tis_cap=2.0,
                                  proximal_logprobs=lp.detach() if prox else None)
        loss.backward()
        out.append((loss.item(), lp.grad.clone(), {k: v.tolist() for k, v in stats.items()}))
    assert out[0][0] == out[1][0] and torch.equal(out[0][1], out[1][1]) and out[0][2] == out[1][2]
    assert out[0][2]["clipped"] == 0 and out[0][2]["approx_kl_sum"] == 0.0 and out[0][2]["ratio_max"] == 1.0


def test_correction_none_weighs_every_token_one():
    lp = torch.tensor([[-0.3, -1.2]], requires_grad=True)
    beh = torch.tensor([[-2.3, -0.2]])  # raw weights e² (truncated to 2) and e⁻¹
    mask = torch.ones(1, 2)
    w = aggregation_weights(mask, "token_mean")
    kw = dict(clip_low=0.2, clip_high=0.28, tis_cap=2.0)
    _, on = policy_loss(lp, beh, torch.tensor([1.0]), mask, w, **kw)
    loss, off = policy_loss(lp, beh, torch.tensor([1.0]), mask, w, correction="none", **kw)
    loss.backward()
    assert on["iw_sum"].item() == pytest.approx(2.0 + math.exp(-1.0), rel=1e-6) and on["iw_truncated"].item() == 1
    assert off["iw_sum"].item() == 2.0 and off["iw_truncated"].item() == 0
    assert off["iw_max"].item() == pytest.approx(math.exp(2.0), rel=1e-6)  # still reported: the gap exists
    assert lp.grad.tolist()[0] == pytest.approx([-0.5, -0.5])
    assert off["behaviour_kl_sum"].item() == pytest.approx(0.5 * (4.0 + 1.0), rel=1e-6)


def test_mini_batch_plan_covers_every_sample_once_per_epoch():
    plan = mini_batch_plan(10, 4, 2, "0/7")
    assert len(plan) == 8 and [len(s) for s in plan] == [3, 3, 2, 2] * 2
    for epoch in (plan[:4], plan[4:]):
        assert sorted(i for step in epoch for i in step) == list(range(10))
    assert plan[:4] != plan[4:]  # a fresh split per epoch
    assert mini_batch_plan(10, 4, 2, "0/7") == plan  # deterministic in the seed (a resume plans the same)
    assert mini_batch_plan(10, 4, 2, "0/8") != plan
    assert mini_batch_plan(5, 1, 2, "x") == [(0, 1, 2, 3, 4)] * 2  # one mini-batch: the batch, in order
    with pytest.raises(ValueError, match="train.mini_batches=6"):
        mini_batch_plan(5, 6, 1, "x")
    obj = PolicyObjective.of(RunConfig(train=TrainConfig(mini_batches=2, epochs=3)))
    assert len(obj.update_plan(8, "s")) == 6
