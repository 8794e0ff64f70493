"""Validation: each domain's score on its validation split, at the weights the engines serve.

In: a `RunConfig` (`eval.*`, the domains), a `TrajectoryRunner` (the env plane: runs episodes), a
`RewardScorer` (the reward plane, under a run id of the evaluation's own, so its keys never meet a training
run's), the policy version served and a tag naming the evaluation. Out: an `Evaluation` — per domain the
mean score, the episodes scored and those that failed.

An episode's score is its reward clipped to [0, 1]: format penalties shape training but are not a negative
score. An episode that fails for an infrastructure reason (it ended FAILED or ABORTED, its env worker died,
its reward could not be computed) runs again, with the same seed and a fresh id, up to `eval.retries` times;
one that still fails is counted as failed and left out of the mean — never averaged in as 0. One that fails
in its domain's own code (a `Fault`: its env, agent or reward function raised) is not run again, and counts
toward the domain's circuit breaker (`rollout.circuit_breaker`): a domain that keeps failing so stops the
evaluation at once with `DomainBroken` (its first error and traceback), as it stops training rollout.
A dataset domain with fewer validation rows than `eval.episodes_per_domain` (`rows`, from the driver) scores
each row once (`announce_episodes` says so once per run). Every episode
runs at once; the whole evaluation is bounded by one trajectory's timeout per try
(`rollart.control.rollout.trajectory_timeout_s`). Greedy unless `eval.temperature` > 0.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from pathlib import Path
from typing import Mapping

from rollart.config import RunConfig
from rollart.control import DomainBroken
from rollart.control.breaker import DomainBreaker
from rollart.control.rollout import trajectory_timeout_s
from rollart.types import Evaluation, RewardScorer, Status, Task, TrajectoryRunner

log = logging.getLogger("rollart")


async def evaluate(cfg: RunConfig, runner: TrajectoryRunner, scorer: RewardScorer, version: int,
                   tag: str, rows: Mapping[str, int] | None = None) -> Evaluation:
    """Score `eval.episodes_per_domain` validation episodes of every domain at policy `version` (a dataset domain
    with fewer validation rows, `rows[domain]`, scores each row once)."""
    n, retries = cfg.eval.episodes_per_domain, cfg.eval.retries
    counts = episodes(cfg, rows or {})
    tasks = [
        Task(f"eval/{tag}/{domain}/{i}", domain, domain_cfg.env, seed=i, group_id=f"eval/{tag}/{domain}", split="val")
        for domain, domain_cfg in sorted(cfg.domains.items())
        for i in range(counts[domain])
    ]
    breaker = DomainBreaker(cfg.rollout.circuit_breaker)
    faults: dict[str, int] = {}

    async def one(task: Task) -> tuple[str, float | None]:
        why = ""
        for attempt in range(retries + 1):
            # a fresh id per try: the proxy remembers aborted ids, a worker refuses a running one
            run = task if attempt == 0 else replace(task, trajectory_id=f"{task.trajectory_id}~{attempt}")
            try:
                traj = await runner.run(run, version)
            except Exception as exc:  # noqa: BLE001 — its env worker died: run it again
                why = f"{type(exc).__name__}: {exc}"
                continue
            if traj.status is not None and traj.status.trainable:
                result = await scorer.score(traj)
                if result.ok:
                    breaker.record(traj.scored(result.reward))
                    return task.domain, min(max(result.reward, 0.0), 1.0)
                why = f"reward: {result.error}"
                traj = traj.finished(Status.FAILED, why, fault=result.fault)
            else:
                why = f"{traj.status.value if traj.status else 'unfinished'}: {traj.status_reason}"
            if traj.fault is not None:  # the domain's own code (env, agent, reward fn): running it again cannot help
                faults[task.domain] = faults.get(task.domain, 0) + 1
                if trip := breaker.record(traj):
                    raise DomainBroken(trip)
                return task.domain, None
        log.warning("evaluation episode %s failed %d time%s, not scored (last: %s)", task.trajectory_id,
                    retries + 1, "s" * (retries > 0), why)
        return task.domain, None

    timeout = trajectory_timeout_s(cfg) * (retries + 1)
    log.info("evaluation %s: %d validation episodes of %d domain(s)", tag, len(tasks), len(cfg.domains))
    try:
        # asyncio.timeout, not wait_for: CPython 3.11's wait_for, cancelled (Ctrl-C), leaves the gather it
        # cancelled with an exception nobody retrieves ("_GatheringFuture exception was never retrieved" and
        # a traceback on the console); awaited directly, the cancelled gather's outcome is the task's own.
        # A task group: a broken domain (DomainBroken) cancels every other episode at once.
        async with asyncio.timeout(timeout):
            async with asyncio.TaskGroup() as group:
                running = [group.create_task(one(t)) for t in tasks]
    except TimeoutError:
        raise TimeoutError(f"evaluation {tag!r} did not finish within {timeout:.0f}s") from None
    except BaseExceptionGroup as errors:  # (only ever DomainBroken: `one` catches the rest)
        raise errors.exceptions[0] from None
    for domain, n_failed in sorted(faults.items()):
        log.warning("evaluation %s: %d episode%s of domain %s failed in the domain's own code (env, agent or reward "
                    "function), not scored", tag, n_failed, "s" * (n_failed != 1), domain)
    scores: dict[str, list[float]] = {domain: [] for domain in sorted(cfg.domains)}
    failed = dict.fromkeys(scores, 0)
    for domain, score in (t.result() for t in running):
        if score is None:
            failed[domain] += 1
        else:
            scores[domain].append(score)
    return Evaluation({d: sum(v) / len(v) for d, v in scores.items() if v}, {d: len(v) for d, v in scores.items()},
                      failed)


def episodes(cfg: RunConfig, rows: Mapping[str, int]) -> dict[str, int]:
    """Validation episodes per domain: `eval.episodes_per_domain`, or a dataset domain's validation rows when
    there are fewer (each row scored once, never twice)."""
    n = cfg.eval.episodes_per_domain
    return {domain: min(n, rows[domain]) if domain in rows else n for domain in cfg.domains}


def validation_rows(cfg: RunConfig, model_path: str | Path) -> dict[str, int]:
    """Each dataset domain's validation rows after the filters (read here, as the env workers read them)."""
    from rollart.envs.chat import ChatTokens
    from rollart.envs.dataset import open_dataset_domain
    from rollart.models import load_tokenizer

    datasets = {name: dom for name, dom in cfg.domains.items() if dom.data is not None}
    if not datasets:
        return {}
    tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    return {name: len(open_dataset_domain(name, dom, ChatTokens(tokenizer, dom.system_prompt, dom.thinking),
                                          cfg.seed).rows.validation) for name, dom in datasets.items()}


def announce_episodes(cfg: RunConfig, rows: Mapping[str, int]) -> None:
    """Say, once per run, which domains evaluate fewer episodes than `eval.episodes_per_domain`, and why."""
    for domain, count in sorted(episodes(cfg, rows).items()):
        if count < cfg.eval.episodes_per_domain:
            log.info("evaluation: domain %s has %d validation rows, fewer than eval.episodes_per_domain=%d: each "
                     "row is scored once per evaluation (%d episodes)", domain, count, cfg.eval.episodes_per_domain,
                     count)
