"""What the RL loop uses of the system, of the rollout and of the recorder — the loop's three collaborators.

`LoopSystem` is implemented by the real system (`rollart.job.system.System`: Ray actors on real pools) and by
the cluster twin's (`rollart.sim.system.SimSystem`: simulated workers in virtual time); `Rollout` by the
control plane's `RolloutScheduler`; `LoopRecorder` by `rollart.job.recorder.RunRecorder` (the run directory)
and the twin's `SimRecorder` (step records in memory). `tests/unit/test_loop_protocols.py` checks every
implementation against these, member by member.

The timeline lanes of the loop's own phases are named here too, for both systems.
"""

from __future__ import annotations

import asyncio
from typing import Mapping, Protocol, Sequence

from rollart.types import Evaluation, RunState, TimedMetrics, Trajectory

DRIVER_LANE = "control/driver/0"  # the loop's waits and weight syncs
TRAINER_LANE = "trainer/train/0"  # train steps


class Rollout(Protocol):
    """The control plane as the loop drives it (started by `LoopSystem.start_rollout`)."""

    async def get_batch(self, train_version: int, trainer_free: asyncio.Event | None = None) -> list[Trajectory]:
        """Step 1: wait for the batch that trains `train_version` and take it (`trainer_free`, set while no
        train step runs: then an adaptive batch may be taken, `rollout.min_batch_fraction`)."""
        ...

    def pause_admission(self) -> None:
        """No new trajectory starts (`rollout.barrier=batch`, from a batch taken until its weights serve)."""
        ...

    def resume_admission(self) -> None: ...


class TrainedVersion(Protocol):
    version: int  # the newest policy version the trainer has published (its next train step trains it)


class LoopSystem(Protocol):
    """The planes, wired: what the loop calls for each of the six steps and around them."""

    resumed: RunState  # where this start goes on from, under this start's run id and attempt
    trainer: TrainedVersion
    inference_version: int  # the version every engine serves

    def start_rollout(self, batches: int) -> Rollout:
        """Start the control plane for `batches` batches, from the trainer's version on."""
        ...

    async def suspend(self) -> None:
        """Step 2: the engines admit no new generation; what is in flight stays."""
        ...

    async def update_weights(self, version: int) -> Mapping[str, float]:
        """Step 3: every engine swaps to `version`, already pulled in the background; its metrics."""
        ...

    async def resume(self) -> None:
        """Step 4: generation is admitted again."""
        ...

    async def recompute_kv(self) -> Mapping[str, float]:
        """Step 5: the requests in flight across the swap re-prefill their context under the new weights
        (`inference.on_update=recompute`; `keep`: they decode on over their old KV). Each engine does it at
        its own swap, between two of its steps — so no token is decoded over stale KV and no engine waits
        for the others' swaps —; this step collects what they recomputed (`weights/recompute_tokens`)."""
        ...

    async def now_serving(self, version: int) -> None:
        """After steps 2–5: the rollout starts trajectories under `version`, and a domain whose workload
        drifted is re-routed (`rollout.remap`)."""
        ...

    async def lend_trainer(self) -> None:
        """A train step just ended: while the trainer waits for its next batch, its devices generate on the
        trainer's own weights (`train.elastic_generation`; otherwise nothing). Returns at once."""
        ...

    async def reclaim_trainer(self) -> TimedMetrics:
        """Before a train step: the trainer's devices come back from generation, what ran there going on
        elsewhere (nothing to do, no span, when they were not lent)."""
        ...

    async def train_step(self, batch: list[Trajectory], version: int) -> TimedMetrics:
        """Step 6: one optimizer step on `batch` at `version` (publishes version + 1); rollout goes on."""
        ...

    async def evaluate(self, tag: str) -> Evaluation: ...

    async def metrics(self) -> dict[str, float]:
        """The planes' counters for a step record."""
        ...

    async def save_checkpoint(self, state: RunState) -> None:
        """A checkpoint with `state`, completed by the rollout's own cut (its scored, untrained groups and how
        far the ledger file goes), taken with no await in between."""
        ...


class LoopRecorder(Protocol):
    """Where the loop reports what it did."""

    def rl_starts(self) -> None:
        """The first RL step begins now (what came before is start-up)."""
        ...

    def phase(self, phase: TimedMetrics) -> None:
        """A phase of the loop (a batch wait, a weight sync): into the next step record."""
        ...

    def train_step_done(self, step: int, train_step: TimedMetrics) -> None: ...

    def step(self, step: int, batch: Sequence[Trajectory], version: int, metrics: Mapping[str, float]) -> None: ...

    def evaluation(self, step: int, evaluation: Evaluation) -> None: ...

    def wall_s(self) -> float:
        """The run's wall time so far, over all its attempts (what a checkpoint keeps for the next one)."""
        ...
