"""The supervised warm start before RL: expert demonstrations of the trained domains, in batches.

In: a `RunConfig` (`train.warm_start`: steps, batch size, expert probability; the domains, seeded by
`seed`), the tokenizer's model path (every demonstration is laid out as its domain's rollouts: agent domains
with the gateway's own session code, env domains with the domain's `ChatTokens`) and a trainer with `sft_step`. Out: `demonstration_batches(cfg, model_path)` — the batches,
the same in every process; `run_warm_start(cfg, trainer, model_path, on_step)` — runs them, telling
`on_step(step, steps, metrics)` after each.

How many steps: `RunConfig.warm_start_steps()` — `train.warm_start.steps`, or by default 100 for the built-in tiny
model and none for a `model.path` checkpoint; `warm_start_line` says which at start-up.

Used by `rollart train` before its first RL step (a resumed run skips it) and by
`rollart.job.driver.warm_start_checkpoint` (a warm-started base for LoRA runs and benchmarks).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from rollart.config import RunConfig
from rollart.envs.agents.demonstrations import demonstrate_agent
from rollart.envs.chat import ChatTokens
from rollart.envs.expert import demonstrate
from rollart.envs.spec import domain_env_factory
from rollart.models import load_tokenizer

log = logging.getLogger("rollart")


class SupervisedTrainer(Protocol):
    def sft_step(self, samples: Sequence[Any]) -> Mapping[str, float]: ...


def demonstration_batches(cfg: RunConfig, model_path: str | Path) -> Iterator[list[Any]]:
    """`train.warm_start.steps` batches of `batch_size` expert demonstrations, the trained domains in turn
    (agent domains only when they name `demonstrations`), each laid out as its domain's rollouts are: the
    tokenizer at `model_path`, the domain's system prompt and thinking switch (a dataset domain's rows are
    read here)."""
    ws = cfg.train.warm_start
    domains = demonstrated(cfg)
    steps = cfg.warm_start_steps()
    if not domains or not steps:
        return
    tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    chats = {d: ChatTokens(tokenizer) if cfg.domains[d].runs_agent else
             ChatTokens(tokenizer, cfg.domains[d].system_prompt, cfg.domains[d].thinking) for d in domains}
    factories = {d: domain_env_factory(d, cfg.domains[d], chats[d], cfg.seed, cfg.envs.workspace) for d in domains
                 if not cfg.domains[d].runs_agent}
    picks = [domains[i % len(domains)] for i in range(ws.batch_size)]
    rng = random.Random(cfg.seed)

    def sample(domain: str) -> Any:
        domain_cfg, seed = cfg.domains[domain], rng.randrange(10**9)
        if domain_cfg.runs_agent:
            return demonstrate_agent(domain, domain_cfg, chats[domain], seed, ws.expert_prob,
                                     cfg.envs.gateway.model_name)
        return demonstrate(domain, domain_cfg, seed, "train", ws.expert_prob, factories[domain]).sample(chats[domain])

    for _ in range(steps):
        yield [sample(d) for d in picks]


def demonstrated(cfg: RunConfig) -> list[str]:
    """The domains the warm start demonstrates: the trained ones, agent domains only when they name
    `demonstrations`."""
    return sorted(d for d, c in cfg.domains.items() if c.weight > 0 and (not c.runs_agent or c.demonstrations))


def undemonstrated(cfg: RunConfig) -> list[str]:
    """The trained agent domains the warm start leaves out: they name no `demonstrations`."""
    return sorted(d for d, c in cfg.domains.items() if c.weight > 0 and c.runs_agent and not c.demonstrations)


def warm_start_line(cfg: RunConfig) -> str:
    """What the run's start-up says of the warm start: how many steps, and whether that was a default and why."""
    steps = cfg.warm_start_steps()
    if cfg.train.warm_start.steps is not None:
        return f"warm start: {steps} supervised steps (train.warm_start.steps={steps})" if steps else \
            "warm start: off (train.warm_start.steps=0)"
    if steps:
        return (f"warm start: {steps} supervised steps on the domains' expert demonstrations — on by default for the "
                "built-in tiny model, which learns each domain's action format from them (train.warm_start.steps=0 "
                "turns it off)")
    return ("warm start: off — model.path is a checkpoint of your own, which already writes its format "
            "(train.warm_start.steps=N turns it on)")


def run_warm_start(cfg: RunConfig, trainer: SupervisedTrainer, model_path: str | Path,
               on_step: Callable[[int, int, Mapping[str, float]], None] | None = None) -> None:
    """`train.warm_start.steps` supervised steps of `trainer` on the demonstrations; an agent domain that
    names none is said to be left out (one line each), and a warm start with nothing to demonstrate too."""
    log.info("%s", warm_start_line(cfg))
    if cfg.warm_start_steps():
        for domain in undemonstrated(cfg):
            log.info("warm start: agent domain %s names no demonstrations (domains.%s.demonstrations): it starts RL "
                     "from the model as it is", domain, domain)
        if not demonstrated(cfg):
            log.info("warm start skipped: no trained domain has demonstrations (train.warm_start.steps=%d)",
                     cfg.warm_start_steps())
    for step, samples in enumerate(demonstration_batches(cfg, model_path)):
        metrics = trainer.sft_step(samples)
        if on_step is not None:
            on_step(step, cfg.warm_start_steps(), metrics)
