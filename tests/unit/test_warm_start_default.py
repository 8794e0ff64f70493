"""The warm start defaults to what fits the model: on (100 steps) for the built-in tiny model, which learns each
domain's action format from it, off for a `model.path` checkpoint of the user's own; a value given is kept either
way, and the start-up line says which and why."""

from __future__ import annotations

from rollart.config import RunConfig
from rollart.job.warm_start import warm_start_line


def test_the_warm_start_is_on_for_the_tiny_model_and_off_for_a_checkpoint() -> None:
    tiny, mine = RunConfig(), RunConfig(model={"path": "/models/my-llama"})
    assert tiny.train.warm_start.steps is None and (tiny.warm_start_steps(), mine.warm_start_steps()) == (100, 0)
    assert "on by default for the built-in tiny model" in warm_start_line(tiny)
    assert warm_start_line(mine).startswith("warm start: off — model.path is a checkpoint of your own")
    given = RunConfig(model={"path": "/models/my-llama"}, train={"warm_start": {"steps": 7}})
    assert given.warm_start_steps() == 7 and warm_start_line(given) == \
        "warm start: 7 supervised steps (train.warm_start.steps=7)"
    assert RunConfig(train={"warm_start": {"steps": 0}}).warm_start_steps() == 0
