"""Reward functions in the shapes people have: recognised from the signature, called as their framework calls them
(TRL's own reward functions run here, batched, with the row's columns by name; verl's compute_score with its four
arguments, a float or a dict with "score"); one of no known shape is refused naming the shapes; a function's own
exception is a `Fault` (the domain's), TRL's None is "unscorable" (no fault), a timeout is neither."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from trl.rewards import accuracy_reward, think_format_reward

from rollart.config import RewardConfig, RunConfig
from rollart.reward.client import LocalRewardClient
from rollart.reward.protocol import RewardInputError, call_reward
from rollart.reward.registry import RewardFns, check_spec, import_reward
from rollart.reward.shapes import RewardShapeError, ShapedReward, shape_of
from rollart.types import Task, Trajectory, Turn

CHAT_ROW = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 3 + 4?"}],
            "reward_model": {"style": "rule", "ground_truth": "7"}, "extra_info": {"index": 3, "split": "train"},
            "messages": [{"role": "user", "content": "What is 3 + 4?"}], "answer": "7", "solution": "7"}


def traj(action: str, row: dict | None = None, i: int = 0, version: int = 2, domain: str = "gsm") -> Trajectory:
    reference = {"row": dict(row), "question": "What is 3 + 4?"} if row is not None else {"answer": "7"}
    turn = Turn((1, 2), (5, 6, 7), (-0.1, -0.2, -0.3), (version,) * 3, observation="What is 3 + 4?", action=action)
    return Trajectory(f"g/{i}", Task(f"g/{i}", domain, "dataset", 0, "g"), version, (turn,), reference=reference)


def test_each_shape_is_recognised_from_its_signature() -> None:
    def mine(trajectory): ...
    def by_row(response, row): ...
    def trl_style(completions, ground_truth, **kwargs): ...
    def compute_score(data_source, solution_str, ground_truth, extra_info=None): ...

    class Scorer:
        def __call__(self, trajectory): ...

    assert [shape_of(f).kind for f in (mine, by_row, trl_style, compute_score, Scorer, accuracy_reward,
                                       think_format_reward)] == ["trajectory", "row", "trl", "verl", "trajectory",
                                                                 "trl", "trl"]
    assert shape_of(trl_style).required_columns == ("ground_truth",)
    assert shape_of(accuracy_reward).required_columns == ("solution",)


@pytest.mark.parametrize("bad", ["def f(a, b): ...", "def f(*, x): ...", "def f(solution_str, ground_truth, judge): ...",
                                 "def f(): ..."])
def test_a_function_of_no_known_shape_is_refused_naming_the_shapes(bad: str) -> None:
    scope: dict = {}
    exec(bad, scope)
    with pytest.raises(RewardShapeError, match="f\\(trajectory\\).*TRL's f\\(completions.*verl's compute_score"):
        shape_of(scope["f"], "mod:f")


def test_trl_functions_get_the_batch_and_the_rows_columns_by_name() -> None:
    seen = {}

    def reward(completions, ground_truth, prompts, completion_ids, trainer_state, data_source, **kwargs):
        seen.update(completions=completions, ground_truth=ground_truth, prompts=prompts, ids=completion_ids,
                    step=trainer_state.global_step, max_steps=trainer_state.max_steps, source=data_source,
                    extra=kwargs["extra_info"], keys=set(kwargs))
        kwargs["log_metric"]("lengths", 2.0)
        return [1.0 if c[0]["content"].endswith("7}") else 0.0 for c in completions]

    row = {**CHAT_ROW, "ground_truth": "7"}
    shaped = ShapedReward(reward, shape_of(reward), "m:reward", max_steps=50)
    outs = asyncio.run(shaped.score_batch([traj("\\boxed{7}", row, 0), traj("\\boxed{8}", row, 1)]))
    assert [o.reward for o in outs] == [1.0, 0.0] and outs[0].details == {"metric/lengths": 2.0}
    assert seen["completions"][0] == [{"role": "assistant", "content": "\\boxed{7}"}]  # a chat row: conversational
    assert seen["prompts"][0] == CHAT_ROW["messages"] and seen["ground_truth"] == ["7", "7"]
    assert seen["ids"] == [[5, 6, 7], [5, 6, 7]] and (seen["step"], seen["max_steps"]) == (2, 50)
    assert seen["source"] == ["openai/gsm8k"] * 2 and seen["extra"][0] == {"index": 3, "split": "train"}
    assert "prompt" not in seen["keys"] and {"reward_model", "answer", "log_extra"} <= seen["keys"]  # as TRL passes


def test_trls_own_accuracy_reward_scores_through_rollart() -> None:
    shaped = import_reward("trl.rewards:accuracy_reward")
    outs = asyncio.run(shaped.score_batch([traj("so \\boxed{7}", CHAT_ROW, 0), traj("\\boxed{9}", CHAT_ROW, 1)]))
    assert [o.reward for o in outs] == [1.0, 0.0]
    assert asyncio.run(call_reward(shaped, traj("\\boxed{7}", CHAT_ROW))).reward == 1.0  # one at a time (remote)


def test_trl_none_is_unscorable_not_a_fault_and_a_raise_is_a_fault() -> None:
    sys.modules[__name__].none_reward = lambda completions, **kw: [None for _ in completions]
    sys.modules[__name__].raising_reward = lambda completions, **kw: [1.0 / 0 for _ in completions]
    fns = RewardFns(RunConfig())
    client = LocalRewardClient(fns.get, RewardConfig(retries=1, backoff_s=0.0))
    results = asyncio.run(client.score_group([traj("a", CHAT_ROW, 0), traj("b", CHAT_ROW, 1)], f"{__name__}:none_reward"))
    assert [r.ok for r in results] == [False, False] and all(r.fault is None for r in results)
    assert "cannot score" in results[0].error
    results = asyncio.run(client.score_group([traj("a", CHAT_ROW, 0)], f"{__name__}:raising_reward"))
    assert not results[0].ok and results[0].fault is not None and results[0].fault.where == "reward"
    assert "ZeroDivisionError" in results[0].fault.error and "raising_reward" in results[0].fault.traceback
    assert results[0].attempts == 2  # retried once (reward.retries), then the fault stands


def test_verl_compute_score_gets_its_four_arguments_and_may_return_a_dict() -> None:
    calls = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return {"score": float(solution_str.endswith(ground_truth + "}")), "acc": True}

    shaped = ShapedReward(compute_score, shape_of(compute_score), "m:compute_score")
    out = asyncio.run(call_reward(shaped, traj("\\boxed{7}", {k: v for k, v in CHAT_ROW.items() if k != "answer"})))
    assert out.reward == 1.0 and out.details == {"acc": True}
    assert calls[0] == ("openai/gsm8k", "\\boxed{7}", "7", {"index": 3, "split": "train", "num_turns": 1})
    # on an env domain (no row): the env's reference answer is the ground truth, the domain the data source
    out = asyncio.run(call_reward(shaped, traj("\\boxed{7}", None, domain="math")))
    assert out.reward == 1.0 and calls[-1][:3] == ("math", "\\boxed{7}", "7")

    def float_score(data_source, solution_str, ground_truth, extra_info):
        return 0.25

    assert asyncio.run(call_reward(ShapedReward(float_score, shape_of(float_score), "f"), traj("x", CHAT_ROW))).reward == 0.25


def test_a_row_function_still_needs_a_row() -> None:
    def by_row(response, row):
        return float(response == row["answer"])

    shaped = ShapedReward(by_row, shape_of(by_row), "m:by_row")
    assert asyncio.run(call_reward(shaped, traj("7", CHAT_ROW))).reward == 1.0
    with pytest.raises(RewardInputError, match="takes a dataset row"):
        asyncio.run(call_reward(shaped, traj("7", None)))


def test_check_spec_refuses_a_shapeless_function_where_the_config_names_it(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "user_rewards.py").write_text("def two(a, b):\n    return 0.0\n"
                                              "def trl(completions, solution, **kw):\n    return [0.0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardShapeError, match="domains.x.reward.fn: .*user_rewards:two.*fits none"):
        check_spec("user_rewards:two", "domains.x.reward.fn")
    assert check_spec("user_rewards:trl", "domains.x.reward.fn").kind == "trl"
