"""DAPO's overlong reward shaping and overlong filtering, by hand and through build_train_batch; the group
filter; the config presets and their deprecations."""

import logging

import pytest

from rollart.algo import build_train_batch, reward_variance
from rollart.algo.shaping import overlong_penalty, was_cut
from rollart.config import TrainConfig
from rollart.config.loader import ConfigError, load_config
from rollart.types import Status, Task, Trajectory, Turn


def traj(tid, group, reward, lengths=(10,), finish="stop", status=Status.COMPLETED):
    turns = tuple(Turn((1, 2), tuple(range(3, 3 + n)), (-0.5,) * n, (0,) * n, finish_reason=finish if i == len(lengths) - 1
                       else "stop") for i, n in enumerate(lengths))
    task = Task(tid, "math", "math", 0, group)
    return Trajectory(tid, task, 0, turns=turns).finished(status).scored(reward)


def test_overlong_penalty_is_zero_then_linear_to_the_limit():
    # L_max = 100, L_cache = 20: no penalty up to 80 tokens, −(n − 80)/20 after, −1 at 100
    for n, expected in [(10, 0.0), (80, 0.0), (85, -0.25), (90, -0.5), (100, -1.0)]:
        assert overlong_penalty(traj("a", "g", 1.0, (n,)), 100, 0.2, 1.0) == pytest.approx(expected)
    assert overlong_penalty(traj("a", "g", 1.0, (90,)), 100, 0.2, 0.5) == pytest.approx(-0.25)
    assert overlong_penalty(traj("a", "g", 1.0, (100,)), 100, 0.0, 1.0) == 0.0  # off
    assert overlong_penalty(traj("a", "g", 1.0, (10, 95, 85)), 100, 0.2, 1.0) == pytest.approx(-0.75)  # worst turn


def test_a_trajectory_was_cut_by_a_token_limit_or_truncation():
    assert not was_cut(traj("a", "g", 1.0))
    assert was_cut(traj("a", "g", 1.0, finish="length"))
    assert was_cut(traj("a", "g", 1.0, status=Status.TRUNCATED))


def test_the_batch_shapes_rewards_before_the_advantages_and_masks_cut_trajectories():
    trajs = [traj("a", "g", 1.0, (10,)), traj("b", "g", 1.0, (100,), finish="length"),
             traj("c", "g", 0.0, (10,)), traj("d", "g", 0.0, (10,))]
    cfg = TrainConfig(overlong_buffer=0.2, overlong_filter=True, normalize_std=False)
    batch = build_train_batch(trajs, 0, cfg, {"math": 100})
    rewards = [s.reward for s in batch.samples]
    assert rewards == [1.0, 0.0, 0.0, 0.0]  # b: 1 − 1 at the limit
    mean = 0.25
    assert [s.advantage for s in batch.samples] == pytest.approx([1 - mean, -mean, -mean, -mean])
    assert sum(batch.samples[1].loss_mask) == 0 and sum(batch.samples[0].loss_mask) == 10
    with pytest.raises(ValueError, match="max_new_tokens"):
        build_train_batch(trajs, 0, cfg)


def test_a_batch_the_filter_would_empty_trains_with_advantage_zero(caplog):
    trajs = [traj("a", "g", 1.0, (5,), finish="length"), traj("b", "g", 0.0, (5,), status=Status.TRUNCATED)]
    with caplog.at_level(logging.WARNING, logger="rollart.algo"):
        batch = build_train_batch(trajs, 3, TrainConfig(overlong_filter=True))
    assert [s.advantage for s in batch.samples] == [0.0, 0.0] and all(sum(s.loss_mask) for s in batch.samples)
    assert "every trajectory of batch 3 was cut" in caplog.text


def test_reward_variance_keeps_varied_and_single_groups_and_drops_constant_ones():
    assert reward_variance([traj("a", "g", 1.0), traj("b", "g", 0.0)]) is None
    assert reward_variance([traj("a", "g", 1.0)]) is None
    assert "no reward variance" in reward_variance([traj("a", "g", 0.5), traj("b", "g", 0.5 + 1e-12)])


def test_presets_the_given_settings_win_and_deprecated_keys_map(caplog):
    assert TrainConfig(algorithm="dr_grpo").aggregation == "seq_sum_norm"
    assert TrainConfig(algorithm="dr_grpo", aggregation="token_mean").aggregation == "token_mean"
    assert TrainConfig().model_dump() == TrainConfig(algorithm="grpo").model_dump()  # grpo: today's defaults
    with caplog.at_level(logging.WARNING, logger="rollart.config"):
        assert TrainConfig(importance_weights=False).correction == "none"
        assert TrainConfig(advantage="reinforce").algorithm == "reinforce_pp"
        assert TrainConfig(advantage="grpo", importance_weights=True) == TrainConfig()
    assert "deprecated" in caplog.text
    with pytest.raises(ValueError, match="tis_floor"):
        TrainConfig(tis_floor=3.0)
    with pytest.raises(ConfigError, match="train.algorithm: 'ppo2' is not one of grpo, dr_grpo"):
        load_config(None, ["train.algorithm=ppo2"])
    # a resolved run config (every key written) reloads as it ran: the preset does not override it
    cfg = load_config(None, ["train.algorithm=dapo", "train.clip_high=0.5"])
    assert (cfg.train.clip_high, cfg.train.aggregation, cfg.train.dynamic_sampling) == (0.5, "token_mean", True)
