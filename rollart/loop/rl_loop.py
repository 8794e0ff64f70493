"""`RLLoop`: the RL loop of rollart — the paper's six steps, one loop for every mode, real or simulated.

In: a `RunConfig`, a `LoopSystem`, a `LoopRecorder`, a clock (protocols.py; the twin's is virtual). Out:
`run()` takes the run from the system's resumed step to `train.steps`, evaluating and checkpointing on the
way. Rollout never stops; each RL step does, by name: 1 `get_batch`; 2–5 `serve_latest_weights`
(suspend, update, resume, recompute the KV in flight); 6 `start_train_step` in the background, and back to
1: rollout and training overlap. Between a train step's end and the next one's start the trainer's devices
are lent to generation (`lend_trainer`, `reclaim_trainer`: the system decides whether they are), and the part
of each batch wait with no train step in flight is `time/get_batch_idle` (the trainer waiting for rollout);
`trainer_free` (an event, set exactly then) lets the rollout hand out an adaptive batch
(`rollout.min_batch_fraction`). A train step lands (ends, its weights served) before the next starts;
without a barrier in the background, the moment it ends (control/staleness.py (2)) — a failed landing
raises at once. Modes are values, not forks: the α gate keeps a batch of version v to trajectories begun
at ≥ v − α (α = 0: the synchronous loop); `rollout.barrier=batch` admits nothing while a batch trains.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Callable

from rollart.base.background import unless_fails
from rollart.config import RunConfig
from rollart.loop.protocols import DRIVER_LANE, LoopRecorder, LoopSystem, Rollout
from rollart.types import Span, TimedMetrics, Trajectory


@dataclass
class TrainStepInFlight:
    step: int  # the RL step it trains
    task: asyncio.Task[TimedMetrics]


class RLLoop:
    """The RL steps of one training job (resumed or fresh). It owns the run state it checkpoints."""

    def __init__(self, cfg: RunConfig, system: LoopSystem, recorder: LoopRecorder,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.system, self.recorder, self.clock = cfg, system, recorder, clock
        self.state = system.resumed  # the step reached and the first evaluation, under this start's identity
        self.rollout: Rollout | None = None  # started once the first evaluation is done
        self.training: TrainStepInFlight | None = None
        self.landing: asyncio.Task[None] | None = None  # land_in_background's task
        self.trainer_free_at: float | None = None  # when the last train step ended (None: one is in flight)
        self.trainer_free = asyncio.Event()  # set while no train step runs: the adaptive batch may start

    async def run(self) -> None:
        """The steps; on an error, the train step and landing in flight are cancelled first (the system
        must not be closed under a weight sync whose error nobody would read)."""
        try:
            await self._steps()
        finally:
            await self._cancel_in_flight()

    async def _steps(self) -> None:
        cfg, first_step, steps = self.cfg, self.state.step, self.cfg.train.steps
        admits_while_training = cfg.rollout.barrier != "batch"
        await self.serve_latest_weights()  # start-up (a resumed trainer is ahead): not a step's phase
        first_version = self.system.trainer.version  # the policy version step `first_step` trains
        if self.state.eval_first is None:
            self.state = replace(self.state, eval_first=await self.evaluate(first_step, "first"))
        self.rollout = rollout = self.system.start_rollout(steps - first_step)
        self.recorder.rl_starts()  # the steps begin: what came before is start-up
        self.trainer_free_at = self.clock()
        self.trainer_free.set()
        await self.system.lend_trainer()
        for step in range(first_step, steps):
            version = first_version + (step - first_step)  # the policy version this step trains
            checkpoint_due = step > first_step and step % cfg.train.checkpoint_every == 0
            # The α gate: with the engines older than version − α nothing they start can join this batch, so
            # the train step in flight must land first (α = 0: every step; α ≥ 1: never, by steps 2–5).
            if checkpoint_due or self.system.inference_version < version - cfg.rollout.alpha:
                await self.land_train_step()
            if checkpoint_due:  # after landing: the checkpoint holds every step before `step`
                await self.save_checkpoint(step)
            batch = await self.get_batch(version)                         # 1
            if not admits_while_training:
                rollout.pause_admission()
            await self.land_train_step()                                  # 2–5 (one train step at a time)
            if step > first_step and step % cfg.eval.every == 0:
                await self.evaluate(step, f"step{step}")
            self.recorder.phase(await self.system.reclaim_trainer())
            self.start_train_step(step, batch, version)                   # 6, overlapping the next batch's rollout
            if admits_while_training:
                self.land_in_background()
            else:
                await self.land_train_step()
                rollout.resume_admission()
            self.recorder.step(step, batch, version, await self.system.metrics())
        await self.land_train_step()
        await self.evaluate(steps, "last")
        await self.save_checkpoint(steps)

    async def get_batch(self, version: int) -> list[Trajectory]:
        """Step 1: the batch that trains `version` (stale work is cancelled as it is taken)."""
        began = self.clock()
        rollout = self.rollout
        assert rollout is not None
        # the event only when an adaptive batch can be taken (a rollout without one takes the version alone)
        taking = (rollout.get_batch(version, self.trainer_free) if self.cfg.rollout.min_batch_fraction < 1
                  else rollout.get_batch(version))
        batch = await unless_fails(taking, self.landing)
        ended = self.clock()
        free = self.trainer_free_at
        idle = max(0.0, ended - max(began, free)) if free is not None else 0.0
        self.recorder.phase(TimedMetrics({"time/get_batch_wait": ended - began, "time/get_batch_idle": idle},
                                         Span("get_batch.wait", began, ended, DRIVER_LANE)))
        return batch

    async def serve_latest_weights(self) -> TimedMetrics:
        """Steps 2–5: every engine serves the trainer's newest version (nothing to do, no span, if it does)."""
        system, version = self.system, self.system.trainer.version
        if version <= system.inference_version:
            return TimedMetrics({})
        began = self.clock()
        await system.suspend()                                            # 2
        try:
            metrics = await system.update_weights(version)               # 3
        finally:
            await system.resume()                                         # 4
        ended = self.clock()
        metrics = {**metrics, **await system.recompute_kv()}              # 5
        await system.now_serving(version)
        return TimedMetrics({"time/weights.exposed": ended - began, **metrics},
                            Span("weights.sync", began, ended, DRIVER_LANE))

    def start_train_step(self, step: int, batch: list[Trajectory], version: int) -> None:
        """Step 6: train on `batch` at `version` in the background; the loop goes on at once."""
        task = asyncio.create_task(self.system.train_step(batch, version))
        self.trainer_free_at = None
        self.trainer_free.clear()
        task.add_done_callback(self._trainer_freed)
        self.training = TrainStepInFlight(step, task)

    def _trainer_freed(self, _: asyncio.Task[TimedMetrics]) -> None:
        self.trainer_free_at = self.clock()
        self.trainer_free.set()

    async def land_train_step(self) -> None:
        """Wait for the train step in flight, then serve the weights it made (or for the landing that does)."""
        landing, self.landing = self.landing, None
        if landing is not None:
            await landing
        await self._land()

    def land_in_background(self) -> None:
        """Serve the weights of the train step in flight as soon as it ends, while the loop goes on."""
        self.landing = asyncio.create_task(self._land())

    async def _land(self) -> None:
        if self.training is not None:
            training, self.training = self.training, None
            self.recorder.train_step_done(training.step, await training.task)
            await self.system.lend_trainer()  # (at once: the devices generate while the next batch fills)
        self.recorder.phase(await self.serve_latest_weights())

    async def _cancel_in_flight(self) -> None:
        """Cancel the background landing and the train step, if any (after a clean run there are none)."""
        tasks = [t for t in (self.landing, self.training and self.training.task) if t is not None]
        self.landing = self.training = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # their errors follow from the one propagating

    async def evaluate(self, step: int, tag: str) -> dict[str, float]:
        """Validation scores at the served weights, recorded after `step` RL steps."""
        evaluation = await self.system.evaluate(tag)
        self.recorder.evaluation(step, evaluation)
        return dict(evaluation.scores)

    async def save_checkpoint(self, step: int) -> None:
        """A checkpoint of the run as it stands before `step` (rollout goes on while it is written)."""
        self.state = replace(self.state, step=step, wall_s=self.recorder.wall_s())
        await self.system.save_checkpoint(self.state)
