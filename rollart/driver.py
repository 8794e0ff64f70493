"""The driver: the RL loop of rollart — the paper's six steps, one loop for every mode.

Rollout never stops: the control plane keeps environments generating in the background and fills a
buffer with scored GRPO groups. Each RL step of `_RLLoop.run` then does, by name:

    1    get_batch              take the next batch from the buffer (waits while rollout fills it)
    2–5  serve_latest_weights   suspend admission to the engines, swap every engine to the trainer's newest
                                weights, resume (5: each engine re-prefills the requests it had in flight)
    6    start_train_step       train on the batch in the background and go straight back to step 1:
                                HERE rollout and training overlap

`await_training` waits for the train step in the background; it must land before the next one starts
and before the weights it makes can be served (`land_train_step` does both). Without a barrier the
landing itself runs in the background (`land_in_background`): the new weights are served the moment the
train step ends, while the next batch fills, not after it is taken. That keeps trajectories fresher and
reopens the admission window at once (control/staleness.py's (2): with the engines one version behind the
batch being formed it is α batches, with them level α + 1) — so a batch need not wait for its slowest
group. A landing that fails raises in the loop at once, even while it waits for a batch.

Sync, one-off and async are values, not forks. `rollout.alpha` (α) bounds staleness: the batch of RL
step k trains at policy version v_k and holds only trajectories begun at version ≥ v_k − α (the α gate in
`run`). With α = 0 the train step in flight and its weight sync must land before a batch can fill —
exactly the synchronous loop. `rollout.barrier=batch` stops admitting new trajectories from the moment a
batch is taken until its train step has landed and its weights are served.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from rollart.config import RunConfig
from rollart.control import RolloutScheduler
from rollart.preflight import check_config, check_run_dir
from rollart.recorder import RunRecorder
from rollart.resources import Runtime
from rollart.system import DRIVER_LANE, System, build_system, demonstration_batches
from rollart.types import Evaluation, Span, TimedMetrics, Trajectory

T = TypeVar("T")


def evaluate(cfg: RunConfig) -> Evaluation:
    """Score `cfg.model.path` on every domain's validation split (blocking)."""

    check_config(cfg)

    async def run() -> Evaluation:
        with Runtime(cfg) as runtime:
            system = build_system(cfg, runtime, with_trainer=False)
            try:
                return await system.evaluate("eval")
            finally:
                await system.close()

    return asyncio.run(run())


def warm_start_checkpoint(cfg: RunConfig, out_dir: str | Path,
                          on_step: Callable[[int, int, dict[str, float]], None] | None = None) -> Path:
    """Only the warm start (`train.warm_start` on the trained domains' demonstrations, all weights — a
    `train.lora` is ignored), in this process, written to `out_dir` as a Hugging Face checkpoint: a base
    for LoRA runs (`model.path`) and for benchmarks that compare RL settings from one start."""
    import torch

    from rollart.algo import PolicyObjective
    from rollart.trainer import Trainer

    full = cfg.model_copy(update={"train": cfg.train.model_copy(update={"lora": None})})
    torch.set_num_threads(full.train.threads)
    trainer = Trainer(full, PolicyObjective.from_config(full.train))
    for step, samples in enumerate(demonstration_batches(full, trainer.model_path)):
        metrics = trainer.sft_step(samples)
        if on_step:
            on_step(step, full.train.warm_start.steps, metrics)
    out = Path(out_dir)
    trainer.model.save_pretrained(out, safe_serialization=True)
    trainer.tokenizer.save_pretrained(out)
    return out


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run a whole training job (blocking); returns the run summary (also in RUN_DIR/summary.json)."""
    return asyncio.run(_run_training_job(cfg))


async def _run_training_job(cfg: RunConfig) -> dict[str, Any]:
    check_config(cfg)  # before anything starts
    check_run_dir(cfg)
    started_at = time.time()
    with Runtime(cfg) as runtime:
        system = build_system(cfg, runtime)
        workers = [n for c in system.inference.values() for n in c.names] + system.trainer.names
        recorder = RunRecorder(cfg, resume_step=system.resumed.step or None, workers=workers,
                               started_at=started_at, incidents=system.incidents,
                               ledger_bytes=system.resumed.ledger_bytes)
        try:
            return await _RLLoop(cfg, system, recorder).run()
        finally:
            await system.close()
            if system.scheduler is not None:  # what stopping it ended
                recorder.ledger(system.scheduler.drain_journal())
            recorder.close()


@dataclass
class _TrainStepInFlight:
    """The train step running in the background: the RL step it trains, and the task that returns it."""

    step: int
    task: asyncio.Task[TimedMetrics]


class _RLLoop:
    """The RL steps of one training job (resumed or fresh), from its first step to its last checkpoint."""

    def __init__(self, cfg: RunConfig, system: System, recorder: RunRecorder,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.system, self.recorder = cfg, system, recorder
        self.clock = clock  # the cluster twin (rollart.sim) runs this loop in virtual time
        self.scheduler: RolloutScheduler | None = None  # started once the first evaluation is done
        self.training: _TrainStepInFlight | None = None
        self.landing: asyncio.Task[None] | None = None  # land_in_background's task

    async def run(self) -> dict[str, Any]:
        """The steps; if they stop on an error, the train step and landing still in flight are cancelled
        first, so the system is not closed under a weight sync whose error nobody would read."""
        try:
            return await self._steps()
        finally:
            await self._cancel_in_flight()

    async def _steps(self) -> dict[str, Any]:
        cfg, system, recorder = self.cfg, self.system, self.recorder
        first_step, steps = system.resumed.step, cfg.train.steps
        alpha, overlap = cfg.rollout.alpha, cfg.rollout.barrier != "batch"
        if first_step == 0:
            self.warm_start()
        await system.sync_weights(system.trainer.version)  # start-up, not a step's phase: not recorded
        first_version = system.trainer.version  # the policy version step `first_step` trains
        recorder.eval_first = system.resumed.eval_first
        if recorder.eval_first is None:
            recorder.eval_first = await self.evaluate(first_step, "first")
        self.scheduler = scheduler = system.start_rollout(steps - first_step)
        recorder.rl_starts()  # what came before is the first step's time/startup, not part of its time/step

        for step in range(first_step, steps):
            version = first_version + (step - first_step)  # the policy version this step trains
            checkpoint_due = step > first_step and step % cfg.train.checkpoint_every == 0
            # The α gate. This step's batch may hold only trajectories begun at version ≥ version − α. If the
            # engines serve an older version than that, nothing they start now can ever join it, and
            # get_batch would wait in vain: the train step in flight must land and its weights be served
            # first. With α = 0 that is every step (the synchronous loop); with α ≥ 1 never, since step 2–5
            # below keeps the engines at most one version behind the trainer.
            if checkpoint_due or system.served_version < version - alpha:
                await self.land_train_step()
            if checkpoint_due:  # after landing: the checkpoint holds every step before `step`
                await self.save_checkpoint(step)
            batch = await self.get_batch(version)                         # 1
            if not overlap:
                scheduler.pause_admission()
            await self.land_train_step()                                  # 2–5 (one train step at a time)
            if step > first_step and step % cfg.eval.every == 0:
                await self.evaluate(step, f"step{step}")
            self.start_train_step(step, batch, version)                   # 6, overlapping the next batch's rollout
            if overlap:
                self.land_in_background()
            else:
                await self.land_train_step()
                scheduler.resume_admission()
            recorder.step(step, batch, version, await system.metrics())
            recorder.ledger(scheduler.drain_journal())

        await self.land_train_step()
        await self.evaluate(steps, "last")
        await self.save_checkpoint(steps)
        recorder.final(await system.metrics())  # the counters as the run ends (a replacement may have landed)
        return recorder.flush()

    def warm_start(self) -> None:
        """The supervised warm start before RL (`train.warm_start`), on the timeline as one driver span."""
        began = self.clock()
        self.system.warm_start(self.recorder.warm_start)
        ended = self.clock()
        self.recorder.phase(TimedMetrics({"time/warm_start": ended - began},
                                         Span("warm_start", began, ended, DRIVER_LANE)))

    async def save_checkpoint(self, step: int) -> None:
        """A checkpoint of the run as it stands before `step`: the trainer's state, the scheduler's (its
        scored groups not trained yet among it) and how much of the ledger file it covers — a consistent
        cut, taken with no await in between; rollout goes on while it is written."""
        self.recorder.ledger(self.scheduler.drain_journal())
        state = self.system.run_state(step, self.scheduler.state_dict(), self.recorder.eval_first,
                                      self.recorder.ledger_size())
        await self.system.save_checkpoint(state)

    # --- the named steps -----------------------------------------------------------------------------
    async def get_batch(self, version: int) -> list[Trajectory]:
        """Step 1: the batch that trains `version` (stale work is cancelled as it is taken)."""
        waited_from = self.clock()
        batch = await self._unless_landing_fails(self.scheduler.get_batch(version))
        waited_to = self.clock()
        self.recorder.phase(TimedMetrics({"time/get_batch_wait": waited_to - waited_from},
                                         Span("get_batch.wait", waited_from, waited_to, DRIVER_LANE)))
        return batch

    async def serve_latest_weights(self) -> None:
        """Steps 2–5: every engine serves the trainer's newest version (a no-op if it does already)."""
        self.recorder.phase(await self.system.sync_weights(self.system.trainer.version))

    def start_train_step(self, step: int, batch: list[Trajectory], version: int) -> None:
        """Step 6: train on `batch` at `version` in the background; the loop goes on at once."""
        self.training = _TrainStepInFlight(step, asyncio.create_task(self.system.train_step(batch, version)))

    async def await_training(self) -> None:
        """Wait for the train step in flight, if any, and record it."""
        if self.training is not None:
            training, self.training = self.training, None
            self.recorder.train_step_done(training.step, await training.task)

    async def land_train_step(self) -> None:
        """Wait for the train step in flight, then serve the weights it made (or for the landing that does)."""
        if self.landing is not None:
            landing, self.landing = self.landing, None
            await landing
        await self._land()

    def land_in_background(self) -> None:
        """Serve the weights of the train step in flight as soon as it ends, while the loop goes on."""
        self.landing = asyncio.create_task(self._land())

    async def _land(self) -> None:
        await self.await_training()
        await self.serve_latest_weights()

    async def _cancel_in_flight(self) -> None:
        """Cancel the background landing and the train step, if any (after a clean run there are none)."""
        training = self.training.task if self.training is not None else None
        tasks = [task for task in (self.landing, training) if task is not None]
        self.landing = self.training = None
        for task in tasks:
            task.cancel()
        # their errors (or cancellations) are the consequence of the one already propagating: not raised again
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _unless_landing_fails(self, wait: Awaitable[T]) -> T:
        """The result of `wait`; a background landing that fails meanwhile (its train step or its weight
        sync) raises its error at once rather than after the wait."""
        landing = self.landing
        if landing is None:
            return await wait
        waiting = asyncio.ensure_future(wait)
        try:
            await asyncio.wait({waiting, landing}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done() and landing.exception() is not None:
                await landing  # raises
            return await waiting
        finally:
            waiting.cancel()  # a no-op once it is done

    async def evaluate(self, step: int, tag: str) -> dict[str, float]:
        """Validation scores at the served weights, recorded after `step` RL steps."""
        evaluation = await self.system.evaluate(tag)
        self.recorder.evaluation(step, evaluation)
        return dict(evaluation.scores)
