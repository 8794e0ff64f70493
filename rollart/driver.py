"""The driver: the six steps of DESIGN.md §2 in one loop, for every mode.

Sync, one-off and async are values, not forks: `rollout.alpha` bounds staleness (batch `step` trains at
version base + step on trajectories begun at ≥ version − α), and `rollout.barrier=batch` makes rollout and
training alternate (no overlap). With α = 0 the previous train step and its weight sync must land before a
batch can fill, which is exactly the synchronous loop.

    1 get_batch → 2 suspend → 3 update → 4 resume (→ 5 engines re-prefill in-flight requests)
    → 6 train_step, overlapping the rollout that goes on.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from rollart.config import RunConfig
from rollart.config_loader import ConfigError
from rollart.recorder import RunRecorder
from rollart.resources import Runtime
from rollart.system import System, build_system


def evaluate(cfg: RunConfig) -> dict[str, float]:
    """Score `cfg.model.path` on every domain's validation split (blocking)."""

    async def run() -> dict[str, float]:
        with Runtime(cfg) as runtime:
            system = build_system(cfg, runtime, train=False)
            try:
                return await system.evaluate("eval")
            finally:
                await system.close()

    return asyncio.run(run())


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run a whole training job (blocking); returns the run summary (also in RUN_DIR/summary.json)."""
    return asyncio.run(_train(cfg))


def check_run_dir(cfg: RunConfig) -> None:
    """Never train over a finished or interrupted run: continue it (resume=true) or pick another run_dir."""
    used = [p for p in ("metrics.jsonl", "checkpoints") if (Path(cfg.run_dir) / p).exists()]
    if used and not cfg.resume:
        raise ConfigError(
            f"run_dir={cfg.run_dir} already holds a run ({', '.join(used)}); add resume=true to continue "
            "it, or give another run_dir"
        )


async def _train(cfg: RunConfig) -> dict[str, Any]:
    check_run_dir(cfg)  # before anything starts
    started_at = time.time()
    with Runtime(cfg) as runtime:
        system = build_system(cfg, runtime)
        workers = [n for c in system.inference.values() for n in c.names] + system.trainer.names
        rec = RunRecorder(cfg, resume_step=system.resume_step or None, workers=workers, started_at=started_at)
        try:
            return await _loop(cfg, system, rec)
        finally:
            await system.close()
            rec.close()


async def _loop(cfg: RunConfig, system: System, rec: RunRecorder) -> dict[str, Any]:
    start, alpha, overlap = system.resume_step, cfg.rollout.alpha, cfg.rollout.barrier != "batch"
    if start == 0:
        system.warm_start(rec.warm_start)
    await system.sync_weights(system.trainer.version)
    base = system.trainer.version - start  # RL step k trains at version base + k
    rec.eval_first = system.trainer.extra_state.get("eval_first")
    if rec.eval_first is None:
        rec.evaluation(start, await system.evaluate("first"))
        rec.eval_first = rec.evals[start]
    prior = rec.eval_first
    sched = system.start_rollout(cfg.train.steps - start)
    training: tuple[int, asyncio.Task] | None = None

    async def finish() -> None:  # wait for the running train step, record it, serve its weights
        nonlocal training
        if training:
            rec.trained(training[0], await training[1])
            training = None
        rec.add(await system.sync_weights(system.trainer.version), span="weights.sync")

    for step in range(start, cfg.train.steps):
        version = base + step
        checkpoint_due = step > start and step % cfg.train.checkpoint_every == 0
        if checkpoint_due or system.served_version < version - alpha:
            await finish()
        if checkpoint_due:  # in a thread: rollout callbacks keep running while it writes
            state = {"step": step, "scheduler": sched.state_dict(), "eval_first": prior}
            await asyncio.to_thread(system.trainer.save_checkpoint, state)
        waited = time.time()
        batch = await sched.get_batch(version)                                    # 1
        rec.add({"time/get_batch_wait": time.time() - waited, "_span": (waited, time.time())},
                span="get_batch.wait")
        if not overlap:
            sched.pause_admission()
        await finish()                                                            # 2–5
        if step > start and step % cfg.eval.every == 0:
            rec.evaluation(step, await system.evaluate(f"step{step}"))
        training = (step, asyncio.create_task(system.train(batch, version)))      # 6
        if not overlap:
            await finish()
            sched.resume_admission()
        rec.step(step, batch, version, {**sched.metrics(), **system.reward.metrics(), **system.resources.metrics()})
    await finish()
    rec.evaluation(cfg.train.steps, await system.evaluate("last"))
    state = {"step": cfg.train.steps, "scheduler": sched.state_dict(), "eval_first": prior}
    await asyncio.to_thread(system.trainer.save_checkpoint, state)
    return rec.flush()
