"""The behaviour corrections by hand (token/sequence × truncate/mask, one- and two-sided), the quantiles read
from the ratio histogram against numpy's, the engine-mismatch KL over fresh tokens only, the KL estimators
and the constant-length aggregation."""

import math

import numpy as np
import pytest
import torch

from rollart.algo import PolicyObjective, correction_weights, histogram_quantile, kl_penalty, log_ratio_histogram
from rollart.algo.losses import aggregation_weights, policy_loss
from rollart.config import RunConfig

LOG = torch.log(torch.tensor([[3.0, 0.5, 1.2, 9.0], [0.3, 1.0, 1.0, 1.0]]))
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])


def test_token_tis_truncates_each_token_into_its_bounds():
    w = correction_weights(LOG, MASK, "token_tis", 2.0)
    assert w.weight[0, :3].tolist() == pytest.approx([2.0, 0.5, 1.2])
    assert w.truncated.tolist() == [[True, False, False, False], [False, False, False, False]]
    two = correction_weights(LOG, MASK, "token_tis", 2.0, floor=0.6)
    assert two.weight[0, 1].item() == pytest.approx(0.6) and two.weight[1, 0].item() == pytest.approx(0.6)
    assert int(two.truncated.sum()) == 3 and not two.masked.any()


def test_token_mis_masks_tokens_outside_the_bounds():
    w = correction_weights(LOG, MASK, "token_mis", 2.0, floor=0.4)
    assert w.weight[0, :3].tolist() == pytest.approx([0.0, 0.5, 1.2]) and w.weight[1, 0].item() == 0.0
    assert w.masked.tolist() == [[True, False, False, False], [True, False, False, False]]


def test_sequence_modes_weigh_the_whole_sequence_by_its_product():
    rho0, rho1 = 3.0 * 0.5 * 1.2, 0.3  # the padded token (9.0) is not part of sequence 0
    tis = correction_weights(LOG, MASK, "seq_tis", 1.5)
    assert tis.weight[0].tolist() == pytest.approx([1.5] * 4) and tis.weight[1].tolist() == pytest.approx([rho1] * 4)
    assert tis.truncated[0, :3].all() and not tis.truncated[1].any()
    mis = correction_weights(LOG, MASK, "seq_mis", 2.0, floor=0.5)
    assert mis.weight[0].tolist() == pytest.approx([rho0] * 4) and mis.weight[1].tolist() == [0.0] * 4
    assert mis.masked[1].all() and not mis.masked[0].any()


def test_none_and_an_unknown_mode():
    assert correction_weights(LOG, MASK, "none", 2.0).weight.tolist() == [[1.0] * 4, [1.0] * 4]
    with pytest.raises(ValueError, match="train.correction"):
        correction_weights(LOG, MASK, "seq", 2.0)  # type: ignore[arg-type]


def test_quantiles_from_the_histogram_match_numpy_within_a_bin():
    rng = np.random.default_rng(0)
    values = rng.normal(0.0, 0.7, size=(20, 300))
    counts = log_ratio_histogram(torch.tensor(values), torch.ones(20, 300))
    assert counts.sum() == 6000
    for q in (0.01, 0.5, 0.99):
        exact = math.exp(np.quantile(values, q))
        assert histogram_quantile(counts, q) == pytest.approx(exact, rel=0.07), q
    assert math.isnan(histogram_quantile(torch.zeros(256), 0.5))
    # outside ±8 in log space lands in the end bins: the quantile saturates, it does not wrap around
    huge = log_ratio_histogram(torch.tensor([[50.0, -50.0]]), torch.ones(1, 2))
    assert huge[0] == 1 and huge[-1] == 1


def test_the_mismatch_kl_counts_only_fresh_tokens():
    lp = torch.tensor([[-1.0, -1.0, -1.0]])
    beh = torch.tensor([[-1.2, -3.0, -1.0]])  # token 1 is stale (huge gap), tokens 0 and 2 fresh
    mask = torch.ones(1, 3)
    fresh = torch.tensor([[True, False, True]])
    _, stats = policy_loss(lp, beh, torch.tensor([1.0]), mask, aggregation_weights(mask, "token_mean"),
                           clip_low=0.2, clip_high=0.28, tis_cap=2.0, fresh=fresh)
    r = math.exp(0.2)
    assert stats["mismatch_tokens"].item() == 2
    assert stats["mismatch_kl_sum"].item() == pytest.approx(r - 1 - 0.2, rel=1e-5)
    metrics = PolicyObjective.of(RunConfig()).summarize({**stats, "tokens": 3.0}, 1)
    assert metrics["train/mismatch_kl"] == pytest.approx((r - 1 - 0.2) / 2, rel=1e-5)
    assert metrics["train/iw_p50"] == pytest.approx(r, rel=0.07)


def test_kl_estimators_and_a_wrong_name():
    lp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    d = -0.5  # δ = log π_ref − log π_θ
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(-d)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(d * d / 2)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(math.exp(d) - d - 1)
    with pytest.raises(ValueError, match="train.kl_estimator"):
        kl_penalty(lp, ref, "k4")  # type: ignore[arg-type]


def test_sequence_sum_aggregations():
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 0]])
    assert aggregation_weights(mask, "seq_sum").tolist() == [[0, 0.5, 0.5, 0.5], [0, 0, 0.5, 0]]
    norm = aggregation_weights(mask, "seq_sum_norm", norm_length=10)
    assert norm.flatten().tolist() == pytest.approx([0, 0.05, 0.05, 0.05, 0, 0, 0.05, 0])
    # Dr.GRPO's L defaults to the longest trained domain's budget: max_turns × max_new_tokens
    cfg = RunConfig()
    budget = max(min(d.max_turns * d.max_new_tokens, d.max_total_tokens) for d in cfg.domains.values())
    assert PolicyObjective.of(cfg).norm_length == budget
    assert PolicyObjective.of(RunConfig(train={"norm_length": 256})).norm_length == 256
