"""Advantages equal the hand computation (GRPO, RLOO, REINFORCE; with and without std normalisation)."""

import math

import pytest
import torch

from rollart.algo import compute_advantages, grpo_advantages, reinforce_advantages, rloo_advantages
from rollart.algo.advantages import EPS


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


def test_reinforce_batch_baseline():
    rewards = t(1.0, 2.0, 3.0, 6.0)
    groups = torch.tensor([0, 0, 1, 1])
    assert compute_advantages(rewards, groups, "reinforce", False).tolist() == pytest.approx([-2, -1, 0, 3])
    std = math.sqrt(3.5)
    assert reinforce_advantages(rewards, True).tolist() == pytest.approx(
        [-2 / (std + EPS), -1 / (std + EPS), 0.0, 3 / (std + EPS)]
    )


def test_bad_kind_and_shapes_name_the_problem():
    with pytest.raises(ValueError, match="train.advantage"):
        compute_advantages(t(1.0), torch.tensor([0]), "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages(t(1.0, 2.0), torch.tensor([0]))
