"""Episodes drawn from a domain's declared profile (`domains.<d>.profile`): turns, tokens, env and reward times.

In: a `DomainConfig` (its `profile`, `max_turns`, `max_new_tokens`, `max_total_tokens` and `inject`) and a
`random.Random`. Out: `Episode` — everything an episode of that domain will do, fixed when it starts, so a
trajectory run twice with the same task draws the same episode (the twin is deterministic per seed).
A domain with no profile gets the defaults of `DomainProfileConfig`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rollart.config import CountConfig, DomainConfig, DomainProfileConfig
from rollart.envs.injection import lognormal, sample_latency


def sample_count(cfg: CountConfig, rng: random.Random) -> int:
    if cfg.dist == "constant":
        value = cfg.mean
    elif cfg.dist == "empirical":
        value = rng.choice(cfg.samples)
    elif cfg.dist == "gaussian":
        value = rng.gauss(cfg.mean, cfg.std)
    else:
        value = lognormal(cfg.mean, cfg.std, rng)
    return max(cfg.min, int(round(value)))


@dataclass(frozen=True)
class Turn:
    prompt_tokens: int  # added to the context before this turn's generation
    response_tokens: int
    env_s: float  # env.step time (the env's own plus any injected delay)
    env_fails: bool


@dataclass(frozen=True)
class Episode:
    reset_s: float
    turns: tuple[Turn, ...]
    limit: str  # "max_turns" or "max_total_tokens" when that ended it rather than the env; "" otherwise
    reward_s: float


def profile_of(domain: DomainConfig) -> DomainProfileConfig:
    return domain.profile or DomainProfileConfig()


def draw_episode(domain: DomainConfig, rng: random.Random) -> Episode:
    """One episode of `domain`: its turns (capped by max_turns and the token budget) and times."""
    prof, inject = profile_of(domain), domain.inject
    wanted = sample_count(prof.turns, rng)
    n_turns = min(max(wanted, 1), domain.max_turns)
    turns: list[Turn] = []
    context = 0
    limit = "max_turns" if wanted > n_turns else ""
    for k in range(n_turns):
        prompt = sample_count(prof.prompt_tokens if k == 0 else prof.obs_tokens, rng)
        budget = domain.max_total_tokens - context - prompt
        if budget <= 0:
            limit = "max_total_tokens"
            break
        response = min(sample_count(prof.response_tokens, rng), domain.max_new_tokens, budget)
        env_s = sample_latency(prof.env_step, rng)
        fails = False
        if inject is not None:
            env_s += sample_latency(inject.step_latency, rng)
            fails = rng.random() < inject.step_fail_prob
        turns.append(Turn(prompt, response, env_s, fails))
        context += prompt + response
    reset_s = sample_latency(prof.env_reset, rng)
    if inject is not None:
        reset_s += sample_latency(inject.reset_latency, rng)
    return Episode(reset_s, tuple(turns), limit, sample_latency(prof.reward, rng))
