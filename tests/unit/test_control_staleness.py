"""The staleness arithmetic of rollart/control/staleness.py against hand-worked cases."""

import pytest

from rollart.control.staleness import StalenessPolicy
from rollart.types import Task, Trajectory, Turn


def traj(start: int, token_versions: list[list[int]]) -> Trajectory:
    t = Trajectory("t/0", Task("t/0", "d", "e", 0, "t"), start)
    for vs in token_versions:
        t = t.with_turn(Turn((1,), tuple(range(len(vs))), (0.0,) * len(vs), tuple(vs)))
    return t


def test_trajectory_mode_uses_start_version():
    p = StalenessPolicy(alpha=1, mode="trajectory")
    t = traj(start=3, token_versions=[[4, 4], [5]])
    assert p.behaviour_version(t) == 3
    assert p.is_fresh(t, 4) and not p.is_fresh(t, 5)
    assert p.staleness(t, 5) == 2


def test_token_mode_uses_oldest_token_and_ignores_tokenless():
    p = StalenessPolicy(alpha=1, mode="token")
    t = traj(start=3, token_versions=[[4, 4], [5]])
    assert p.behaviour_version(t) == 4
    assert p.is_fresh(t, 5) and not p.is_fresh(t, 6)
    assert p.behaviour_version(traj(start=0, token_versions=[])) is None
    assert p.is_fresh(traj(start=0, token_versions=[]), 100)


@pytest.mark.parametrize(
    "alpha,inf,next_train_version,left,window",
    [
        (0, 0, 0, 10, 1),  # sync: one batch at a time
        (0, 0, 1, 10, 0),  # batch 0 taken, weights not yet updated: admit nothing
        (0, 1, 1, 10, 1),
        (1, 0, 0, 10, 2),
        (1, 0, 1, 10, 1),
        (1, 1, 2, 10, 1),
        (2, 3, 3, 10, 3),
        (2, 3, 3, 1, 1),  # never beyond the batches left
    ],
)
def test_admission_window(alpha, inf, next_train_version, left, window):
    assert StalenessPolicy(alpha).admission_window(inf, next_train_version, left) == window


def test_version_is_fresh_for_next_batch():
    p = StalenessPolicy(alpha=1)
    assert p.version_is_fresh(2, 3) and not p.version_is_fresh(1, 3) and p.version_is_fresh(None, 99)


def test_bad_policy_values_are_named():
    with pytest.raises(ValueError, match="rollout.alpha"):
        StalenessPolicy(alpha=-1)
    with pytest.raises(ValueError, match="rollout.staleness"):
        StalenessPolicy(alpha=1, mode="turn")
