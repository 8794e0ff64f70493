"""`reasoning_gym:<dataset>`: items chosen by seed (train and validation disjoint, finite datasets included),
scored by the dataset's own `score_answer` (the oracle here is reasoning-gym itself), `--policy expert` plays
the item's answer, bad input is refused with the field and what would be valid."""

from __future__ import annotations

import pytest
import reasoning_gym

from rollart.envs import EnvSpecError, check_env_spec, make_env
from rollart.envs.adapters.reasoning_gym import ReasoningGymEnv
from rollart.envs.seeds import episode_seed
from rollart.types import Task


def seeds(split: str, n: int) -> list[int]:
    return [episode_seed(Task(f"t{i}", "rg", "reasoning_gym:x", i, "g", split=split)) for i in range(n)]


def test_items_are_the_datasets_own_and_scored_by_its_score_answer():
    options = {"min_terms": 2, "max_terms": 3, "max_digits": 2, "seed": 7}
    env = make_env("reasoning_gym:basic_arithmetic", options)
    oracle = reasoning_gym.create_dataset("basic_arithmetic", size=500, **options)
    for seed in (0, 3, 41):
        obs, info = env.reset(seed)
        item = oracle[seed]
        assert obs.startswith(item["question"]) and "<answer>" in obs
        assert info["reference"] == {"answer": item["answer"], "dataset": "basic_arithmetic", "index": seed}
        for answer in (item["answer"], "0", f"{item['answer']}0", " " + item["answer"]):
            env.reset(seed)
            _, reward, terminated, truncated, step_info = env.step(f"Thinking... <answer>{answer}</answer>")
            assert reward == oracle.score_answer(answer.strip(), item) and terminated and not truncated
            assert "format_error" not in step_info


def test_train_and_validation_items_are_disjoint_also_for_a_finite_dataset():
    for name in ("basic_arithmetic", "word_ladder"):
        env = make_env(f"reasoning_gym:{name}", {"size": 40} if name == "word_ladder" else {})
        train = {env.index(s) for s in seeds("train", 200)}
        val = {env.index(s) for s in seeds("val", 200)}
        assert train and val and not train & val, name
    finite = make_env("reasoning_gym:word_ladder", {"size": 40})
    assert finite.finite and max(finite.index(s) for s in seeds("train", 200)) < 36
    assert {finite.index(s) for s in seeds("val", 200)} == set(range(36, 40))


def test_expert_scores_one_and_random_is_well_formed():
    env = make_env("reasoning_gym:chain_sum")
    for seed in range(5):
        env.reset(seed)
        assert env.step(env.expert_action())[1] == 1.0
        env.reset(seed)
        action = env.random_action()
        assert action.startswith("<answer>") and "format_error" not in env.step(action)[4]


def test_malformed_and_adversarial_answers():
    env = make_env("reasoning_gym:basic_arithmetic", {"max_answer_chars": 50})
    env.reset(1)
    obs, reward, terminated, _, info = env.step("the answer is 12")
    assert info["format_error"] and not terminated and reward == 0.0 and "<answer>" in obs
    _, reward, terminated, _, info = env.step("<answer>" + "9" * 51 + "</answer>")
    assert reward == 0.0 and terminated and info["score_error"] == "answer too long"

    class Raising:  # a scorer that chokes on what the policy wrote
        def score_answer(self, answer, entry):
            raise ZeroDivisionError("boom")

    env.reset(1)
    env.dataset = Raising()
    _, reward, terminated, _, info = env.step("<answer>1/0</answer>")
    assert reward == 0.0 and terminated and "ZeroDivisionError: boom" in info["score_error"]


def test_system_prompt_goes_in_as_the_datasets_own_chat():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    env = make_env("reasoning_gym:basic_arithmetic", {"system_prompt": "default"})
    obs, info = env.reset(2)
    assert info["prompt_messages"] == [{"role": "system", "content": SYSTEM_PROMPTS["default"]},
                                       {"role": "user", "content": obs}]


def test_bad_specs_and_options_name_what_is_wrong():
    with pytest.raises(EnvSpecError, match="did you mean basic_arithmetic"):
        check_env_spec("reasoning_gym:basic_arithmetc")
    with pytest.raises(ValueError, match="max_termz"):
        make_env("reasoning_gym:basic_arithmetic", {"max_termz": 2})
    with pytest.raises(ValueError, match="system_prompt must be one of"):
        ReasoningGymEnv("basic_arithmetic", system_prompt="chatty")
    with pytest.raises(EnvSpecError, match="unknown env spec"):
        make_env("reasoning_gym:")
