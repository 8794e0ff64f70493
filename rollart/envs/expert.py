"""Expert (oracle) and random actions, and expert demonstrations for supervised warm starts.

In: an env (built-in, adapter, or wrapped by `AsyncEnv`/`FaultInjectingEnv`) after `reset`; for
demonstrations a domain config and seeds. Out: `expert_action(env)` — the built-in env's oracle move
already formatted as the model should write it (frozenlake: BFS shortest path; sokoban: BFS solver;
math: the answer; code: the reference solution; guess_number: binary search); `random_action(env)` — a
uniformly random well-formed action; `demonstrations(...)` — whole expert episodes as chat messages
(user observation / assistant action, alternating), which `ChatTokens.conversation` turns into the exact
token layout of a rollout (prompt ids masked, action ids + stop token trained).

Guarantee: demonstrations of seed s on split `split` play the very episode a rollout of
`Task(seed=s, split=split)` plays (same `episode_seed`), so validation seeds never leak into warm starts
made from train seeds; `Demonstration.sample(chat)` lays one out with the domain's own `ChatTokens` (system
prompt, thinking switch, a row's own chat), token for token as a rollout of it.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Any, Iterable

from rollart.config import DomainConfig
from rollart.envs.chat import ChatTokens
from rollart.envs.protocol import FORMAT_ERROR_KEY, PROMPT_MESSAGES_KEY, EnvFactory
from rollart.envs.seeds import episode_seed
from rollart.envs.spec import make_env
from rollart.types import Split, Task, TrainSample


def unwrap(env: Any) -> Any:
    """The env under rollart's async and fault-injection wrappers."""
    while hasattr(env, "inner") and env.inner is not env:
        env = env.inner
    return env


def expert_action(env: Any) -> str:
    """The oracle's next action for a built-in env (or any env with an `expert_action()` method)."""
    base = unwrap(env)
    fn = getattr(base, "expert_action", None)
    if not callable(fn):
        raise TypeError(
            f"{type(base).__name__} has no expert policy; built-in envs (frozenlake, sokoban, math, code, "
            "guess_number) have one — add an expert_action() method to your env to get demonstrations, or set "
            "train.warm_start.steps=0"
        )
    return fn()


def random_action(env: Any) -> str:
    """A random well-formed action (`random_action()` of built-ins and adapters, GEM's sampler)."""
    base = unwrap(env)
    for name in ("random_action", "sample_random_action"):
        fn = getattr(base, name, None)
        if callable(fn):
            return fn()
    raise TypeError(f"{type(base).__name__} has no random_action() or sample_random_action() method")


@dataclass(frozen=True)
class Demonstration:
    """One expert episode: `messages` alternate user (observation) and assistant (expert action); the first
    prompt may be a whole chat (a dataset row's, with its own system message)."""

    domain: str
    seed: int
    split: Split
    messages: tuple[dict[str, str], ...]
    env_return: float
    terminated: bool  # the env ended the episode (goal reached / answer given) within max_turns
    reference: dict[str, Any]

    def sample(self, chat: ChatTokens) -> TrainSample:
        """The episode laid out as a rollout under `chat` (the domain's), its actions trained."""
        ids, mask = chat.conversation(self.messages)
        sample_id = f"demo/{self.domain}/{self.split}/{self.seed}"
        return TrainSample(trajectory_id=sample_id, group_id=sample_id, domain="sft", token_ids=tuple(ids),
                           loss_mask=tuple(mask), behaviour_logprobs=(0.0,) * len(ids),
                           token_versions=(-1,) * len(ids), advantage=0.0, reward=0.0)


def _sync(value: Any) -> Any:
    if inspect.isawaitable(value):
        raise TypeError("demonstrations play sync envs only (the built-ins are); this env is async")
    return value


def demonstrate(
    domain: str, cfg: DomainConfig, seed: int, split: Split = "train", expert_prob: float = 1.0,
    make: EnvFactory | None = None,
) -> Demonstration:
    """Play one episode of `cfg.env` (built by `make`, the domain's env factory — needed for a dataset domain,
    whose rows it holds) up to `cfg.max_turns` turns: each action is the expert's with probability
    `expert_prob`, else a random well-formed one (seeded by `seed`) — below 1 the episode teaches the action
    format more than the task, leaving the task to RL."""
    if not 0.0 <= expert_prob <= 1.0:
        raise ValueError(f"expert_prob must be in [0, 1], got {expert_prob}")
    chooser = random.Random(f"demo:{seed}")
    env = make() if make is not None else make_env(cfg.env, cfg.options)
    task = Task(f"demo/{domain}/{split}/{seed}", domain, cfg.env, seed, group_id="demo", split=split)
    try:
        obs, info = _sync(env.reset(seed=episode_seed(task)))
        chat = info.get(PROMPT_MESSAGES_KEY)
        messages: list[dict[str, str]] = [dict(m) for m in chat] if isinstance(chat, list) and chat else []
        total, terminated = 0.0, False
        for _ in range(cfg.max_turns):
            action = expert_action(env) if chooser.random() < expert_prob else random_action(env)
            if not messages or messages[-1]["role"] == "assistant":
                messages.append({"role": "user", "content": str(obs)})
            messages.append({"role": "assistant", "content": action})
            obs, reward, terminated, truncated, step_info = _sync(env.step(action))
            total += cfg.format_penalty if step_info.get(FORMAT_ERROR_KEY) else float(reward)
            if terminated or truncated:
                break
        reference = dict(info.get("reference") or {})
        return Demonstration(domain, seed, split, tuple(messages), total, bool(terminated), reference)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def demonstrations(
    domain: str, cfg: DomainConfig, seeds: Iterable[int], split: Split = "train", expert_prob: float = 1.0,
    make: EnvFactory | None = None,
) -> list[Demonstration]:
    """Demonstration episodes of one domain for each seed (see `demonstrate`)."""
    return [demonstrate(domain, cfg, s, split, expert_prob, make) for s in seeds]
