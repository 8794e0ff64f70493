"""Rewards scored where a trajectory ends: which domains (config), the reward plane's `EnvSideScorer` (real
math-verify in its process pool), the env worker that calls it, and the router that passes its scores on."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from rollart.config import DomainConfig, RewardConfig, RunConfig
from rollart.envs.worker import EnvWorker
from rollart.reward import RewardRouter
from rollart.reward.at_end import EnvSideScorer
from rollart.types import EndScorer, GenerationResult, Status, Task, Trajectory, Turn

CALLS = {"n": 0}


def user_reward(trajectory):
    CALLS["n"] += 1
    return 0.5


def broken_reward(trajectory):
    raise RuntimeError("always")


def config(**rewards) -> RunConfig:
    cfg = RunConfig(domains={name: DomainConfig(env="math", reward=reward) for name, reward in rewards.items()})
    cfg.reward = RewardConfig(retries=1, backoff_s=0.001, backoff_max_s=0.002, timeout_s=30.0)
    return cfg


def test_which_domains_are_scored_where_they_end():
    cfg = config(math={"fn": "math"}, rule={"fn": "format"}, env={"fn": "env"},
                 on_service={"fn": "math", "backend": "serverless"}, local={"fn": "math", "backend": "local"},
                 code={"fn": "code"}, user={"fn": f"{__name__}:user_reward"},
                 marked={"fn": f"{__name__}:user_reward", "cheap": True}, unmarked={"fn": "math", "cheap": False})
    at_env = {d for d in cfg.domains if cfg.reward_at_env(d)}
    assert at_env == {"math", "rule", "env", "marked"}
    assert RunConfig().reward_at_env("math") and RunConfig().reward_at_env("frozenlake")  # the default job


def traj(domain: str, action: str = "\\boxed{42}", answer: str = "42") -> Trajectory:
    return Trajectory(f"{domain}-0", Task(f"{domain}-0", domain, "math", 0, "g"), 0,
                      (Turn((), (), (), (), action=action),), status=Status.COMPLETED, reference={"answer": answer})


def test_scorer_is_picklable_until_started_and_scores_with_math_verify():
    cfg = config(math={"fn": "math"}, svc={"fn": "math", "backend": "serverless"})
    scorer = EnvSideScorer(cfg)
    assert isinstance(scorer, EndScorer) and scorer.domains == {"math"}
    scorer = pickle.loads(pickle.dumps(scorer))  # how it reaches an env worker's process
    scorer.start()
    try:
        with pytest.raises(TypeError, match="picklable until start"):
            pickle.dumps(scorer)
        right, wrong = asyncio.run(scorer.score(traj("math"))), asyncio.run(scorer.score(traj("math", "\\boxed{41}")))
        other = asyncio.run(scorer.score(traj("svc")))
        assert (right.ok, right.reward, right.backend, wrong.reward) == (True, 1.0, "env", 0.0)
        assert not other.ok and "svc" in other.error  # not one of its domains: never scored here
        assert scorer.metrics()["reward/env/requests"] == 2.0
    finally:
        scorer.close()


class Answers:
    """An LLM that answers every prompt with one fixed text (real tokenizer ids, then <|im_end|>)."""

    def __init__(self, tokenizer, text: str) -> None:
        self.ids = tuple(tokenizer.encode(text, add_special_tokens=False)) + (tokenizer.convert_tokens_to_ids("<|im_end|>"),)

    async def generate(self, request):
        n = len(self.ids)
        return GenerationResult(request.request_id, request.trajectory_id, self.ids, (0.0,) * n, (0,) * n, "stop",
                                len(request.prompt_token_ids))

    async def abort(self, trajectory_id: str) -> None:
        pass


def test_env_worker_scores_at_the_end_and_the_router_passes_it_on(tiny_model_path):
    from rollart.models import load_tokenizer

    cfg = config(math={"fn": "math", "cheap": True}, broken={"fn": f"{__name__}:broken_reward", "cheap": True},
                 plain={"fn": f"{__name__}:user_reward"})
    cfg.domains["math"].options = {"kinds": ["arithmetic"], "ops": "+", "max_operand": 3}
    tokenizer = load_tokenizer(tiny_model_path)
    worker = EnvWorker(cfg, Answers(tokenizer, "\\boxed{3}"), model_path=tiny_model_path, end_scorer=EnvSideScorer(cfg))
    router = RewardRouter(cfg).start()
    CALLS["n"] = 0

    async def play() -> list[Trajectory]:
        return [await worker.run(Task(f"{d}/0", d, "math", 7, f"{d}"), 0) for d in ("math", "broken", "plain")]

    try:
        math_t, broken_t, plain_t = asyncio.run(play())
        # the math episode (seed 7: some a + b) is scored by math-verify in the worker, its span on the worker's lane
        assert math_t.status is Status.COMPLETED and math_t.reward in (0.0, 1.0)
        assert math_t.reward == (1.0 if math_t.reference["answer"] == "3" else 0.0)
        assert [s.worker for s in math_t.spans if s.name == "reward"] == [worker.name]
        assert broken_t.status is Status.FAILED and "RuntimeError: always" in broken_t.status_reason
        assert plain_t.reward is None and CALLS["n"] == 0  # not cheap: left to the control plane's backend
        passed, scored = asyncio.run(router.score(math_t)), asyncio.run(router.score(plain_t))
        assert (passed.reward, passed.backend, passed.attempts) == (math_t.reward, "env", 0)
        assert (scored.reward, scored.backend, CALLS["n"]) == (0.5, "local", 1)
        # an env worker without the end scorer leaves it unscored: the router scores it itself
        bare = EnvWorker(cfg, Answers(tokenizer, "\\boxed{3}"), model_path=tiny_model_path)
        unscored = asyncio.run(bare.run(Task("math/1", "math", "math", 7, "math"), 0))
        fallback = asyncio.run(router.score(unscored))
        assert unscored.reward is None and fallback.backend == "local" and fallback.reward == math_t.reward
    finally:
        asyncio.run(worker.shutdown())
        router.stop()
