"""Every registered algorithm honours the seam: its name has a config preset and the preset loads; its
advantage estimator, surrogate and group filter have the record's shapes; and it trains one real step of the
tiny model through the `Trainer` (finite loss, a gradient, the version advanced, its metrics reported)."""

from __future__ import annotations

import math

import pytest
import torch

from rollart.algo import ALGORITHMS, PolicyObjective, build_train_batch
from rollart.algo.losses import aggregation_weights, policy_loss
from rollart.config import ALGORITHM_PRESETS, RunConfig, TrainConfig
from rollart.config.loader import load_config
from rollart.types import Status, Task, Trajectory, Turn


def trajectories(n_groups: int = 2, group_size: int = 4) -> list[Trajectory]:
    out = []
    for g in range(n_groups):
        for i in range(group_size):
            n = 3 + (g + i) % 4
            turn = Turn(prompt_token_ids=tuple(range(5, 12)), response_token_ids=tuple(20 + (i * 7 + j) % 300
                                                                                     for j in range(n)),
                        logprobs=tuple(-1.5 - 0.1 * j for j in range(n)), versions=(0,) * n)
            task = Task(f"g{g}/{i}", "math", "math", g, f"g{g}")
            t = Trajectory(task.trajectory_id, task, 0, turns=(turn,)).finished(Status.COMPLETED)
            out.append(t.scored(float((i + g) % 2) + 0.25 * i))
    return out


def test_the_registry_and_the_presets_name_the_same_algorithms():
    assert list(ALGORITHMS) == list(ALGORITHM_PRESETS)
    for name, algorithm in ALGORITHMS.items():
        assert algorithm.name == name


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_preset_loads_and_a_given_setting_wins(name):
    cfg = load_config(None, [f"train.algorithm={name}"])
    for key, value in ALGORITHM_PRESETS[name].items():
        assert getattr(cfg.train, key) == value, key
    assert load_config(None, [f"train.algorithm={name}", "train.clip_low=0.05"]).train.clip_low == 0.05


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_algorithm_has_the_records_shapes(name):
    algorithm = ALGORITHMS[name]
    train = TrainConfig(algorithm=name)
    trajs = trajectories()
    assert algorithm.group_filter(trajs[:4]) is None  # rewards vary: kept
    assert isinstance(algorithm.group_filter([t.scored(1.0) for t in trajs[:4]]), str)  # constant: a reason
    batch = build_train_batch(trajs, 0, train, {"math": 48})
    assert len(batch.samples) == len(trajs) and all(math.isfinite(s.advantage) for s in batch.samples)
    if algorithm.advantages is None:
        assert algorithm.critic and all(s.advantage == 0.0 for s in batch.samples)
    else:
        assert any(s.advantage != 0.0 for s in batch.samples)
    lp = torch.randn(3, 6, dtype=torch.float32).mul(0.2).sub(1.0).requires_grad_()
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0]])
    loss, stats = policy_loss(lp, lp.detach() - 0.05, torch.tensor([0.5, -1.0, 2.0]), mask,
                              aggregation_weights(mask, train.aggregation, norm_length=8), clip_low=train.clip_low,
                              clip_high=train.clip_high, tis_cap=train.tis_cap, surrogate=algorithm.surrogate)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and float(lp.grad.abs().sum()) > 0
    assert float(lp.grad[mask == 0].abs().sum()) == 0.0  # nothing leaks to prompt or padding positions
    assert stats["tokens"] == int(mask.sum())


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_algorithm_trains_one_step_of_the_tiny_model(tiny_model_path, name):
    from rollart.trainer import Trainer

    cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"algorithm": name})
    trainer = Trainer(cfg, PolicyObjective.of(cfg))
    metrics = trainer.train_step(build_train_batch(trajectories(), 0, cfg.train,
                                                   {d: c.max_new_tokens for d, c in cfg.domains.items()}))
    assert trainer.version == 1 and metrics["train/version"] == 1
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    for key in ("train/clip_frac", "train/iw_mean", "train/behaviour_kl", "train/mismatch_kl", "train/iw_p50"):
        assert key in metrics, key
    if ALGORITHMS[name].critic:
        assert metrics["time/critic"] > 0 and math.isfinite(metrics["train/value_loss"])


def test_a_step_with_dapo_overlong_filtering_trains_around_a_masked_trajectory(tiny_model_path):
    from rollart.trainer import Trainer

    cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"algorithm": "dapo", "overlong_filter": True})
    trajs = trajectories()
    cut = trajs[1]
    trajs[1] = Trajectory(cut.trajectory_id, cut.task, 0, turns=tuple(
        Turn(t.prompt_token_ids, t.response_token_ids, t.logprobs, t.versions, finish_reason="length")
        for t in cut.turns)).finished(Status.COMPLETED).scored(float(cut.reward))
    batch = build_train_batch(trajs, 0, cfg.train, {"math": 4})  # g0/1 generated 4 tokens: at the limit
    assert sum(batch.samples[1].loss_mask) == 0 and batch.samples[1].reward < float(cut.reward)  # masked, shaped
    metrics = Trainer(cfg, PolicyObjective.of(cfg)).train_step(batch)
    assert metrics["train/tokens"] == sum(sum(s.loss_mask[1:]) for s in batch.samples)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
