"""build_train_batch: token-in/token-out samples, advantages per group, clear errors on bad input."""

import pytest

from rollart.algo import build_train_batch
from rollart.algo.stats import EPS
from rollart.config import TrainConfig
from rollart.types import Status, Task, Trajectory, Turn


def traj(tid, group, reward, versions=(0, 0), status=Status.COMPLETED, domain="math"):
    turns = (
        Turn(prompt_token_ids=(1, 2, 3), response_token_ids=(10, 11), logprobs=(-0.1, -0.2), versions=versions),
        Turn(prompt_token_ids=(4,), response_token_ids=(12,), logprobs=(-0.3,), versions=(versions[-1] + 1,)),
    )
    task = Task(trajectory_id=tid, domain=domain, env="math", seed=0, group_id=group)
    t = Trajectory(trajectory_id=tid, task=task, start_version=versions[0], turns=turns).finished(status)
    return t.scored(reward) if reward is not None else t


def test_samples_carry_tokens_mask_logprobs_versions_and_group_advantages():
    trajs = [traj("a", "g1", 1.0), traj("b", "g1", 0.0, versions=(0, 1)), traj("c", "g2", 3.0, domain="fl"),
             traj("d", "g2", 3.0, domain="fl")]
    batch = build_train_batch(trajs, version=2, cfg=TrainConfig())
    assert batch.version == 2 and [s.trajectory_id for s in batch.samples] == ["a", "b", "c", "d"]
    b = batch.samples[1]
    assert b.token_ids == (1, 2, 3, 10, 11, 4, 12)
    assert b.loss_mask == (0, 0, 0, 1, 1, 0, 1)
    assert b.behaviour_logprobs == (0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3)
    assert b.token_versions == (-1, -1, -1, 0, 1, -1, 2)
    d = 0.5 / (0.5 + EPS)
    assert [s.advantage for s in batch.samples] == pytest.approx([d, -d, 0.0, 0.0])
    assert [s.reward for s in batch.samples] == [1.0, 0.0, 3.0, 3.0]
    assert batch.samples[2].domain == "fl" and batch.samples[2].group_id == "g2"


def test_rloo_through_the_config():
    trajs = [traj("a", "g", 1.0), traj("b", "g", 2.0), traj("c", "g", 6.0)]
    batch = build_train_batch(trajs, 0, TrainConfig(algorithm="rloo", normalize_std=False))
    assert [s.advantage for s in batch.samples] == pytest.approx([1 - 4.0, 2 - 3.5, 6 - 1.5])


@pytest.mark.parametrize(
    "bad, match",
    [(traj("x", "g", None), "reward is not set"), (traj("x", "g", 1.0, status=Status.ABORTED), "not trainable")],
)
def test_untrainable_input_is_an_error_naming_the_trajectory(bad, match):
    with pytest.raises(ValueError, match=f"x.*{match}|{match}"):
        build_train_batch([bad], 0, TrainConfig())
    with pytest.raises(ValueError, match="no trajectories"):
        build_train_batch([], 0, TrainConfig())
