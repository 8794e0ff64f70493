"""Advantages equal the hand computation: GRPO, RLOO, REINFORCE++ (with and without std normalisation)."""

import math

import pytest
import torch

from rollart.algo import grpo_advantages, reinforce_pp_advantages, rloo_advantages
from rollart.algo.registry import ALGORITHMS
from rollart.algo.stats import EPS
from rollart.config import TrainConfig


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_grpo_normalised_per_group():
    rewards = t(1.0, 0.0, 0.0, 1.0, 2.0, 2.0)
    groups = torch.tensor([7, 7, 3, 3, 9, 9])
    adv = grpo_advantages(rewards, groups, normalize_std=True)
    # groups 7 and 3: mean 0.5, population std 0.5; group 9: all equal -> 0
    d = 0.5 / (0.5 + EPS)
    assert adv.tolist() == pytest.approx([d, -d, -d, d, 0.0, 0.0], abs=1e-12)


def test_grpo_unnormalised_is_mean_centred():
    adv = grpo_advantages(t(3.0, 1.0, 5.0, 0.0), torch.tensor([0, 0, 1, 1]), normalize_std=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 2.5, -2.5])


def test_grpo_group_of_one_is_zero():
    assert grpo_advantages(t(5.0), torch.tensor([0])).tolist() == [0.0]


def test_rloo_leave_one_out():
    rewards = t(1.0, 2.0, 3.0, 4.0)
    groups = torch.tensor([0, 0, 0, 1])
    adv = rloo_advantages(rewards, groups, normalize_std=False)
    assert adv.tolist() == pytest.approx([1 - 2.5, 2 - 2.0, 3 - 1.5, 0.0])
    std = math.sqrt(2 / 3)  # population std of (1, 2, 3)
    adv_n = rloo_advantages(rewards, groups, normalize_std=True)
    assert adv_n.tolist() == pytest.approx([-1.5 / (std + EPS), 0.0, 1.5 / (std + EPS), 0.0])


def test_reinforce_pp_group_baseline_then_token_weighted_batch_normalisation():
    """The paper's REINFORCE++-baseline: A' = r − μ_g, then (A' − mean_B) / (std_B + ε) over the batch's tokens."""
    rewards = t(1.0, 0.0, 3.0, 1.0, 2.0)
    groups = torch.tensor([0, 0, 1, 1, 2])
    tokens = t(1.0, 3.0, 2.0, 2.0, 4.0)
    centred = [0.5, -0.5, 1.0, -1.0, 0.0]
    assert reinforce_pp_advantages(rewards, groups, tokens, False).tolist() == pytest.approx(centred)
    weights = [1, 3, 2, 2, 4]
    mean = sum(w * c for w, c in zip(weights, centred)) / sum(weights)
    std = math.sqrt(sum(w * (c - mean) ** 2 for w, c in zip(weights, centred)) / sum(weights))
    expected = [(c - mean) / (std + EPS) for c in centred]
    assert reinforce_pp_advantages(rewards, groups, tokens, True).tolist() == pytest.approx(expected, rel=1e-12)
    # a low-variance group keeps its small scale (GRPO's per-group σ would blow it up to ±1)
    small = reinforce_pp_advantages(t(0.0, 0.01, 0.0, 1.0), torch.tensor([0, 0, 1, 1]), t(1, 1, 1, 1), True)
    assert abs(small[0]) < 0.02 < abs(small[2])


def test_every_registered_estimator_checks_shapes_by_name():
    for name, algorithm in ALGORITHMS.items():
        if algorithm.advantages is None:
            continue
        with pytest.raises(ValueError, match="rewards"):
            algorithm.advantages(t(1.0, 2.0), torch.tensor([0]), t(1.0, 1.0), TrainConfig(algorithm=name))
