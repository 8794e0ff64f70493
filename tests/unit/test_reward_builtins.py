"""Built-in rewards: math (right, wrong, malformed, missing reference), format, env, code scoring, judge."""

from __future__ import annotations

import asyncio

import pytest

from rollart.config import SandboxConfig
from rollart.reward.code_reward import CodeReward, count_passes, extract_program
from rollart.reward.judge_reward import JudgeReward
from rollart.reward.math_reward import MathReward
from rollart.reward.rule_rewards import env_reward, format_reward
from rollart.types import Task, Trajectory, Turn


def make_traj(actions, reference, domain="math", format_ok=None, env_return=0.0) -> Trajectory:
    format_ok = format_ok or [True] * len(actions)
    turns = tuple(
        Turn((), (), (), (), observation="What is 6 * 7?", action=a, reward=float(i), format_ok=ok)
        for i, (a, ok) in enumerate(zip(actions, format_ok))
    )
    return Trajectory("t", Task("k", domain, domain, 0, "g"), 0, turns, env_return=env_return, reference=reference)


@pytest.fixture(scope="module")
def math_reward():
    fn = MathReward(timeout_s=5, workers=1)
    yield fn
    fn.close()


@pytest.mark.parametrize(
    "answer, gold, expected, parsed",
    [
        ("The product is \\boxed{42}.", "42", 1.0, True),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0, True),
        ("\\boxed{41}", "42", 0.0, True),
        ("I don't know", "42", 0.0, False),
        ("", "42", 0.0, False),
    ],
)
def test_math_right_wrong_malformed(math_reward, answer, gold, expected, parsed):
    out = asyncio.run(math_reward(make_traj([answer], {"answer": gold})))
    assert out.reward == expected and out.details["parsed"] is parsed and out.details["timeout"] is False


def test_math_missing_reference_is_an_error(math_reward):
    with pytest.raises(ValueError, match="reference\\['answer'\\]"):
        asyncio.run(math_reward(make_traj(["\\boxed{1}"], {})))


def test_math_scores_only_the_final_turn(math_reward):
    out = asyncio.run(math_reward(make_traj(["\\boxed{42}", "\\boxed{7}"], {"answer": "42"})))
    assert out.reward == 0.0


def test_format_and_env_rewards():
    traj = make_traj(["a", "b", "c", "d"], {}, format_ok=[True, False, True, True], env_return=2.5)
    out = asyncio.run(format_reward(traj))
    assert out.reward == 0.75 and out.per_turn == (1.0, 0.0, 1.0, 1.0)
    env = asyncio.run(env_reward(traj))
    assert env.reward == 2.5 and env.per_turn == (0.0, 1.0, 2.0, 3.0)
    assert asyncio.run(format_reward(make_traj([], {}))).reward == 0.0


def test_extract_program_prefers_the_last_fence_then_boxed():
    assert extract_program("x\n```python\ndef f(): return 1\n```\n```python\ndef f(): return 2\n```") == "def f(): return 2"
    assert extract_program("\\boxed{def f(x): return {1: x}}") == "def f(x): return {1: x}"
    assert extract_program("  def f(): pass ") == "def f(): pass"


def test_count_passes_reads_only_well_formed_verdicts_in_range():
    out = ('{"i": 0, "ok": true}\n{"i": 1, "ok": false, "error": "E"}\nnoise {"i": 2, "ok": true}\n'
           '{"i": 9, "ok": true}\n{"i": true, "ok": true}\n{"i": 2, "ok": 1}\n[1, 2]\n{"i": 0, "ok": true}\n')
    assert count_passes(out, 3) == (1, "E")


CODE_REF = {"entry_point": "f", "tests": ["assert f(1) == 3", "assert f(2) == 5", "assert f(0) == 1"],
            "language": "python"}


@pytest.mark.parametrize(
    "program, expected",
    [
        ("def f(x):\n    return 2 * x + 1", 1.0),
        ("def f(x):\n    return 2 * x + 1 if x else 0", 2 / 3),
        ("def f(x):\n    return None", 0.0),
        ("def f(x) return", 0.0),  # syntax error: every test fails
        ("import sys\nsys.exit(0)", 0.0),  # exiting early cannot fake a pass
        ("import os\nos._exit(0)", 0.0),
    ],
)
def test_code_reward_fraction_of_tests_passed(program, expected):
    out = asyncio.run(CodeReward(SandboxConfig())(make_traj([f"```python\n{program}\n```"], CODE_REF, "code")))
    assert out.reward == pytest.approx(expected)
    assert out.details["total"] == 3 and "process+rlimits" in out.details["isolation"]


def test_code_reward_humaneval_check_and_missing_tests():
    ref = {"entry_point": "add", "tests": ["def check(candidate):\n    assert candidate(2, 3) == 5\n"]}
    out = asyncio.run(CodeReward(SandboxConfig())(make_traj(["```python\ndef add(a, b):\n    return a + b\n```"], ref, "code")))
    assert out.reward == 1.0
    with pytest.raises(ValueError, match="reference\\['tests'\\]"):
        asyncio.run(CodeReward(SandboxConfig())(make_traj(["```python\npass\n```"], {"tests": []}, "code")))


def test_judge_scores_a_probability_with_the_tiny_model(tiny_model_path):
    judge = JudgeReward(tiny_model_path)
    out = asyncio.run(judge(make_traj(["\\boxed{42}"], {"answer": "42"})))
    assert 0.0 < out.reward < 1.0
    assert out.details["logp_yes"] < 0 and out.details["logp_no"] < 0
    again = asyncio.run(judge(make_traj(["\\boxed{42}"], {"answer": "42"})))
    assert again.reward == pytest.approx(out.reward)  # deterministic forward
