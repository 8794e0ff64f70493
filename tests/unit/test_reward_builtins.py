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


def test_math_shortcut_decides_as_math_verify_does():
    """The shortcut for a bare integer gold and an answer of exactly one \\boxed{integer} agrees with math-verify
    (the oracle) on every case it takes, and leaves every other form to math-verify."""
    import random

    from rollart.reward.math_reward import plain_verdict, verify_answer

    rng = random.Random(0)
    taken = 0
    forms = ["\\boxed{%s}", " \\boxed{ %s } \n", "\\boxed{0%s}", "\\boxed{-%s}", "x \\boxed{%s}", "\\boxed{%s.0}",
             "\\boxed{%s}\\boxed{1}", "%s", "\\boxed{\\frac{%s}{1}}", "\\boxed{\u0663%s}"]
    for _ in range(300):
        gold = str(rng.choice([rng.randint(-20, 20), rng.randint(0, 10**6)]))
        form = rng.choice(forms)
        answer = form % rng.choice([gold.lstrip("-"), str(rng.randint(0, 30))])
        golds = [gold, f" {gold}\n", "1/2"] if rng.random() < 0.2 else [gold]
        for g in golds:
            fast = plain_verdict(g, answer)
            if fast is not None:
                taken += 1
                assert fast == verify_answer(g, answer, 5), (g, answer)
    assert taken > 100  # (vacuous otherwise)
    assert plain_verdict("3", "x \\boxed{3}") is None and plain_verdict("3", "\\boxed{3.0}") is None
    assert plain_verdict("1/2", "\\boxed{1}") is None and plain_verdict("3", "\\boxed{\u0663}") is None


def test_math_keeps_math_verify_verdicts_and_forgets_the_oldest(monkeypatch):
    """A (gold, answer) pair math-verify decided is answered again without the pool, with the same verdict;
    past `VERDICTS_KEPT` pairs the least recently used is forgotten (and goes to math-verify again)."""
    import rollart.reward.math_reward as mr

    monkeypatch.setattr(mr, "VERDICTS_KEPT", 2)
    reward = MathReward(timeout_s=5, workers=1)
    try:
        score = lambda answer, gold="6": asyncio.run(reward(make_traj([answer], {"answer": gold})))
        first = [score("\\boxed{Down}"), score("\\boxed{6.0}"), score("\\boxed{Down}", gold="4")]
        assert [o.reward for o in first] == [0.0, 1.0, 0.0] and all(o.details["parsed"] for o in first)
        reward.close()  # no pool now: what is kept must not need one
        assert reward._pool is None
        again = score("\\boxed{Down}", gold="4")
        assert (again.reward, again.details) == (first[2].reward, first[2].details) and reward._pool is None
        assert score("\\boxed{6.0}").reward == 1.0 and reward._pool is None
        assert score("\\boxed{Down}").reward == 0.0 and reward._pool is not None  # (the oldest: forgotten)
    finally:
        reward.close()


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


def test_exact_and_regex_compare_with_the_reference_answer_and_never_score_a_missing_one_as_zero():
    from rollart.config import DomainConfig, DomainRewardConfig, RunConfig
    from rollart.reward.registry import RewardFns
    from rollart.reward.rule_rewards import exact_reward
    from rollart.reward.protocol import RewardInputError

    assert asyncio.run(exact_reward(make_traj(["so \\boxed{ Lima }"], {"answer": "Lima"}))).reward == 1.0
    assert asyncio.run(exact_reward(make_traj(["Lima"], {"answer": "Lima"}))).reward == 1.0
    assert asyncio.run(exact_reward(make_traj(["\\boxed{lima}"], {"answer": "Lima"}))).reward == 0.0
    with pytest.raises(RewardInputError, match="no reference\\['answer'\\] \\(data/x.jsonl row 4\\)"):
        asyncio.run(exact_reward(make_traj(["Lima"], {"source": "data/x.jsonl row 4"})))
    cfg = RunConfig(domains={"math": DomainConfig(env="math", reward=DomainRewardConfig(
        fn="regex", pattern=r"answer is \$?{answer}\b"))})
    regex_fn = RewardFns(cfg).get("regex")
    assert asyncio.run(regex_fn(make_traj(["So the answer is $3.5 dollars"], {"answer": "3.5"}))).reward == 1.0
    assert asyncio.run(regex_fn(make_traj(["So the answer is 345"], {"answer": "3.5"}))).reward == 0.0  # escaped
    with pytest.raises(ValueError, match="reward fn 'regex' needs reward.pattern"):
        DomainRewardConfig(fn="regex")
    with pytest.raises(ValueError, match="is not a valid regular expression"):
        DomainRewardConfig(fn="regex", pattern="(unclosed")


def test_a_user_reward_of_the_response_and_the_row(tmp_path, monkeypatch):
    from rollart.reward.protocol import RewardInputError, call_reward
    from rollart.reward.registry import check_spec, import_reward

    (tmp_path / "row_rewards.py").write_text(
        "def by_level(response, row):\n    return float(response.strip() == row['answer']) * row['level']\n"
        "async def by_level_async(*, row, response):\n    return 0.5 if row['level'] else 0.0\n")
    monkeypatch.chdir(tmp_path)
    check_spec("row_rewards:by_level", "domains.x.reward.fn")
    fn = import_reward("row_rewards:by_level")
    traj = make_traj(["7"], {"answer": "7", "row": {"answer": "7", "level": 2}})
    assert asyncio.run(call_reward(fn, traj)).reward == 2.0
    assert asyncio.run(call_reward(import_reward("row_rewards:by_level_async"), traj)).reward == 0.5
    with pytest.raises(RewardInputError, match="takes a dataset row, but trajectory t carries none"):
        asyncio.run(call_reward(fn, make_traj(["7"], {"answer": "7"})))


def test_math_scores_a_gsm8k_row_against_its_final_answer(math_reward, tmp_path):
    """The dataset env reads GSM8K's '... #### 72' as 72: math-verify then compares with the model's answer."""
    from rollart.config import DatasetConfig, DomainConfig
    from rollart.envs.chat import ChatTokens
    from rollart.envs.dataset import open_dataset_domain
    from rollart.models import build_tokenizer

    rows = [{"question": f"Q{i}", "answer": f"Half of 144 is 72.\n#### {72 + i}"} for i in range(4)]
    (tmp_path / "gsm.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    cfg = DomainConfig(env="dataset", reward="math", data=DatasetConfig(
        train=str(tmp_path / "gsm.jsonl"), columns={"prompt": "question", "answer": "answer"}, holdout=0.25))
    env = open_dataset_domain("gsm", cfg, ChatTokens(build_tokenizer()), seed=0).make_env()
    _, info = env.reset(0)
    gold = info["reference"]["answer"]
    right = asyncio.run(math_reward(make_traj([f"It is \\boxed{{{gold}}}."], info["reference"])))
    wrong = asyncio.run(math_reward(make_traj(["It is \\boxed{1}."], info["reference"])))
    assert gold in {"72", "73", "74", "75"} and right.reward == 1.0 and wrong.reward == 0.0
