"""Validation: each domain's score on its validation split, at the weights the engines serve.

In: a `RunConfig` (`eval.*`, the domains), a `TrajectoryRunner` (the env plane: runs episodes), a
`RewardScorer` (the reward plane, under a run id of the evaluation's own, so its keys never meet a training
run's), the policy version served and a tag naming the evaluation. Out: an `Evaluation` — per domain the
mean score, the episodes scored and those that failed.

An episode's score is its reward clipped to [0, 1]: format penalties shape training but are not a negative
score. An episode that fails for an infrastructure reason (it ended FAILED or ABORTED, its env worker died,
its reward could not be computed) runs again, with the same seed and a fresh id, up to `eval.retries` times;
one that still fails is counted as failed and left out of the mean — never averaged in as 0. Every episode
runs at once; the whole evaluation is bounded by one trajectory's timeout per try
(`rollart.control.rollout.trajectory_timeout_s`). Greedy unless `eval.temperature` > 0.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from rollart.config import RunConfig
from rollart.control.rollout import trajectory_timeout_s
from rollart.types import Evaluation, RewardScorer, Task, TrajectoryRunner

log = logging.getLogger("rollart")


async def evaluate(cfg: RunConfig, runner: TrajectoryRunner, scorer: RewardScorer, version: int,
                   tag: str) -> Evaluation:
    """Score `eval.episodes_per_domain` validation episodes of every domain at policy `version`."""
    n, retries = cfg.eval.episodes_per_domain, cfg.eval.retries
    tasks = [
        Task(f"eval/{tag}/{domain}/{i}", domain, domain_cfg.env, seed=i, group_id=f"eval/{tag}/{domain}", split="val")
        for domain, domain_cfg in sorted(cfg.domains.items())
        for i in range(n)
    ]

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
            if traj.status is None or not traj.status.trainable:
                why = f"{traj.status.value if traj.status else 'unfinished'}: {traj.status_reason}"
                continue
            result = await scorer.score(traj)
            if result.ok:
                return task.domain, min(max(result.reward, 0.0), 1.0)
            why = f"reward: {result.error}"
        log.warning("evaluation episode %s failed %d time%s, not scored (last: %s)", task.trajectory_id,
                    retries + 1, "s" * (retries > 0), why)
        return task.domain, None

    timeout = trajectory_timeout_s(cfg) * (retries + 1)
    log.info("evaluation %s: %d validation episodes of %d domain(s)", tag, len(tasks), len(cfg.domains))
    try:
        # asyncio.timeout, not wait_for: CPython 3.11's wait_for, cancelled (Ctrl-C), leaves the gather it
        # cancelled with an exception nobody retrieves ("_GatheringFuture exception was never retrieved" and
        # a traceback on the console); awaited directly, the cancelled gather's outcome is the task's own
        async with asyncio.timeout(timeout):
            results = await asyncio.gather(*(one(t) for t in tasks))
    except TimeoutError:
        raise TimeoutError(f"evaluation {tag!r} did not finish within {timeout:.0f}s") from None
    scores: dict[str, list[float]] = {domain: [] for domain in sorted(cfg.domains)}
    failed = dict.fromkeys(scores, 0)
    for domain, score in results:
        if score is None:
            failed[domain] += 1
        else:
            scores[domain].append(score)
    return Evaluation({d: sum(v) / len(v) for d, v in scores.items() if v}, {d: len(v) for d, v in scores.items()},
                      failed)
