"""RolloutScheduler: the control plane the RL loop drives — which episodes run, when they may start, when they
are cancelled, and which finished groups become batches.

In: the rollout and domain config, a `TrajectoryRunner` (env plane), a `RewardScorer` (reward plane), a
`SampleBuffer`, a `StalenessPolicy`, optionally the algorithm's `GroupFilter` (None: every complete group is
kept) and its per-batch bound, and from the driver the inference version it serves and the batches it takes.
Out: complete, scored groups in the buffer, taken as batches (`get_batch`); counters of everything else.

The parts, each with one job:
- `admission.py` — which group starts next and whether one may start now (the α window, domains, seeds,
  redundancy's extra groups, the replay after a resume);
- `collection.py` — running an admitted group's trajectories, scoring them, completing groups (the group
  filter, redundancy's stragglers, failure replacement) and cancelling stale work;
- `groups.py` — the admitted groups and their slots, as plain data; `ledger.py` — where every trajectory
  stands; `scheduler_state.py` — the checkpoint state, as plain data.
This module runs the admission loop, hands batches to the driver, and keeps the whole thing honest: a
background task that raises stops rollout.

Forecast: whenever admission stops to wait, the group it would admit next is told to the runner once
(`TrajectoryRunner.expect`), so the env plane can prepare that group's envs while it waits.

Guarantee (the ledger): every trajectory started ends exactly once — trained, or ABORTED / FAILED / STALE /
FILTERED with a reason; `check_ledger()` returns the violations (none, in every test). When batch b is taken,
every running trajectory that can serve no batch ≥ b+1 is cancelled as STALE; each batch's domain mix is
reported against the target, so completion-order bias is visible.

Failure: a background task of the scheduler that raises (the admission loop, a cancel, a replacement, a
trajectory's own task) — or a failure reported with `fail()` — stops rollout: the batch the driver waits
for (or asks for next) raises `SchedulerFailed` at once, naming the task, with the task's own exception
and traceback as its cause. A worker's death is not such a failure: the trajectory ends FAILED and is
replaced with the same seed. A domain whose own code keeps failing (the per-domain circuit breaker,
breaker.py: `rollout.circuit_breaker`) stops rollout the same way, with `DomainBroken`.

Throughput (issue 41): `rollout.pacing=measured` paces admission under the α bound by what rollout measured
(pacing.py: a group that could only end stale waits for the next weights); `rollout.min_batch_fraction` < 1
lets `get_batch` hand out an adaptive batch — at least that share of the batch, whole groups, the domain
mix kept — once the trainer is idle (the loop's `trainer_free` event is set) and no running trajectory is
older than the next batch allows (so the partial batch makes nothing stale that could have joined it):
`rollout/batch_fraction` says what share each batch held; the trainer normalises the loss by the batch
actually taken.

Checkpoints: `state_dict()` / `load_state_dict()` (scheduler_state.py): a resumed run puts the scored groups
back in the buffer as they were, re-admits the running ones with their seeds, and goes on with the next row
of each dataset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Callable, Mapping, NoReturn

from rollart.base.background import unless_fails
from rollart.config import DomainConfig, RolloutConfig, min_batch_groups
from rollart.control.admission import Admission
from rollart.control.breaker import Trip
from rollart.control.buffer import SampleBuffer, domain_quotas
from rollart.control.collection import Collection
from rollart.control.groups import Group, Groups
from rollart.control.ledger import Fate, Ledger
from rollart.control.pacing import Pacer
from rollart.control.scheduler_state import SchedulerState, decode_state
from rollart.control.staleness import StalenessPolicy
from rollart.types import (GroupFilter, LedgerSink, RewardScorer, Status, Task, Trajectory, TrajectoryRunner,
                           TurnBarrier, UpcomingGroup)

log = logging.getLogger("rollart.control")

EXPECT_TIMEOUT_S = 30.0  # for the runner to take a forecast (`TrajectoryRunner.expect`)


class SchedulerFailed(RuntimeError):
    """A background task of the rollout scheduler failed, so rollout cannot go on; its cause is chained."""


class DomainBroken(SchedulerFailed):
    """A domain's own code (env or agent) kept failing (`rollout.circuit_breaker`): a bug to fix, not an
    outage to resume from. Its message says which domain, how often, and the first error with its traceback."""

    def __init__(self, trip: Trip) -> None:
        super().__init__(trip.message())
        self.trip = trip


class RolloutScheduler:
    def __init__(
        self,
        rollout: RolloutConfig,
        domains: Mapping[str, DomainConfig],
        runner: TrajectoryRunner,
        scorer: RewardScorer,
        buffer: SampleBuffer,
        policy: StalenessPolicy,
        total_batches: int,
        first_version: int = 0,
        seed: int = 0,
        turn_barrier: TurnBarrier | None = None,
        trajectory_timeout_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        ledger_sink: LedgerSink | None = None,
        group_filter: GroupFilter | None = None,
        max_filtered_groups: int = 0,
    ) -> None:
        """`ledger_sink`: where each ledger move is written as it happens (ledger.py); `group_filter`: asked about
        each complete group, at most `max_filtered_groups` dropped per batch (collection.py)."""
        self.cfg = rollout
        self.runner, self.buffer, self.policy = runner, buffer, policy
        self.paused = False
        self.groups = Groups()
        self.ledger = Ledger(ledger_sink, clock)
        self.counts: Counter[str] = Counter()
        self.clock = clock
        self.pacer = Pacer() if rollout.pacing == "measured" else None
        self.admission = Admission(rollout, domains, self.groups, buffer, policy, first_version + total_batches,
                                   first_version, seed, pacer=self.pacer, clock=clock)
        self.min_groups = min_batch_groups(rollout)
        self.collection = Collection(
            rollout, runner, scorer, buffer, policy, self.groups, self.ledger, self.counts, spawn=self._in_background,
            watch=self._watch, wake=self._wake_up, on_trip=self._on_trip, turn_barrier=turn_barrier,
            trajectory_timeout_s=trajectory_timeout_s, clock=clock, group_filter=group_filter,
            max_filtered=max_filtered_groups, on_complete=self._group_completed,
        )
        self.collection.inference_version = first_version
        self.weights = self.admission.weights
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()  # cancels, replacements, drops: kept until done
        self._cohort = 0
        self._announced: tuple[str, int, int] | None = None  # the last forecast told the runner
        self.failure: SchedulerFailed | None = None
        self._failed = asyncio.Event()

    # --- what the loop and the tests read ----------------------------------------------------------------
    @property
    def fate(self) -> dict[str, Fate]:
        return self.ledger.fate

    @property
    def inference_version(self) -> int:
        return self.admission.inference_version

    @property
    def next_train_version(self) -> int:
        return self.admission.next_train_version

    @property
    def groups_per_batch(self) -> int:
        return self.admission.groups_per_batch

    def pending_groups(self) -> int:
        return self.admission.pending_groups()

    def allowed_groups(self) -> int:
        return self.admission.allowed_groups()

    def open_groups(self) -> list[Group]:
        return self.groups.open()

    # --- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._admission_loop(), name="rollart-admission")
        self._watch(self._loop_task, "the admission loop")

    def fail(self, error: BaseException, what: str) -> None:
        """Stop rollout: `what` failed with `error` (the first failure wins; see the module doc)."""
        if self.failure is not None:
            return
        self.failure = SchedulerFailed(f"{what} failed: {type(error).__name__}: {error}")
        self.failure.__cause__ = error
        log.error("rollout stops: %s", self.failure, exc_info=error)
        self._stop_admitting()

    def _on_trip(self, trip: Trip) -> None:
        if self.failure is None:  # told once, by whoever stops the run (its caller)
            self.failure = DomainBroken(trip)
            log.info("rollout stops: domain %s is broken (%d trajectories failed in its own code)", trip.domain,
                     trip.failed)
            self._stop_admitting()

    def _stop_admitting(self) -> None:
        """Rollout is over: the batch waited for raises `self.failure`, and nothing new starts."""
        self.paused = True
        self._failed.set()

    def _watch(self, task: asyncio.Task, what: str) -> None:
        task.add_done_callback(lambda done: self._task_done(done, what))

    def _task_done(self, task: asyncio.Task, what: str) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception(), what)

    def _wake_up(self) -> None:
        self._wake.set()

    async def stop(self, reason: str = "shutdown", timeout_s: float = 60.0) -> None:
        """Cancel everything running (ABORTED) and wait, at most `timeout_s`, until each trajectory has
        ended; what is still running then is cancelled locally and logged."""
        self.paused = True
        if self._loop_task:
            self._loop_task.cancel()
        deadline = asyncio.get_running_loop().time() + timeout_s
        # Until nothing is left: a run that ends while stop waits may spawn a background task of its own (a
        # drop, its group's scoring), waited for in turn — every such wait ends at the one deadline.
        while True:
            for g in self.groups.open():
                await self.collection.cancel_group(g, Status.ABORTED, reason)
            if not (pending := self._unfinished()):
                return
            left = deadline - asyncio.get_running_loop().time()
            _, late = await asyncio.wait(pending, timeout=max(left, 0.0))
            if late:  # the deadline passed
                for task in late:
                    task.cancel()
                log.warning("scheduler stop: %d tasks did not end within %.0fs and were cancelled", len(late),
                            timeout_s)
                return

    def _unfinished(self) -> set[asyncio.Task]:
        """The tasks still running: every started trajectory's, and the scheduler's background ones."""
        runs = {r.handle for g in self.groups.by_id.values() for r in g.runs.values() if r.handle is not None}
        return {t for t in runs | self._background if not t.done()}

    # --- driver hooks --------------------------------------------------------------------------------
    def set_inference_version(self, version: int) -> None:
        self.admission.inference_version = self.collection.inference_version = version
        if self.pacer is not None:
            self.pacer.window_reopened()
        self._wake.set()

    def pause_admission(self) -> None:
        self.paused = True

    def resume_admission(self) -> None:
        self.paused = False
        self._wake.set()

    async def get_batch(self, train_version: int, trainer_free: asyncio.Event | None = None) -> list[Trajectory]:
        """Steps 1 of the loop: block until batch `train_version` is ready, take it, cancel what is stale.

        `trainer_free` (set while no train step runs): with `rollout.min_batch_fraction` < 1, once it is set a
        batch of at least that share (whole groups) is taken as soon as it is ready (the adaptive batch)."""
        if self.failure is not None:
            raise self.failure
        n = self.cfg.batch_size // self.cfg.group_size
        adaptive = trainer_free is not None and self.min_groups < n
        failed = asyncio.ensure_future(self._failure_raised())
        freed = asyncio.ensure_future(self._wake_buffer_when(trainer_free)) if adaptive else None
        try:
            groups = await unless_fails(self.buffer.take_groups(
                n, train_version, self.cfg.get_batch_timeout_s, describe=self.describe,
                min_groups=self.min_groups if adaptive else None,
                partial_ok=lambda: trainer_free is not None and trainer_free.is_set() and self._none_made_stale(
                    train_version),
            ), failed)
        finally:
            failed.cancel()
            if freed is not None:
                freed.cancel()
        for g in groups:
            for t in g.trajectories:
                self.ledger.move(t, Fate.TRAINED, expect=Fate.READY, batch=train_version)
        self.counts["batch_groups"] = len(groups)
        self.counts["batch_groups_nominal"] = n
        self.counts["batches_partial"] += len(groups) < n
        if self.pacer is not None:
            self.pacer.batch_taken(self.clock())
            self.pacer.window_reopened()
            self.pacer.prune(self.groups.by_id)
        mix = Counter(g.domain for g in groups)
        target = domain_quotas(self.weights, len(groups))
        for d in self.weights:
            self.counts[f"mix_actual/{d}"] = mix.get(d, 0)
            self.counts[f"mix_target/{d}"] = target.get(d, 0)
        self.admission.next_train_version = train_version + 1
        self.collection.batch_taken()
        await self.collection.cancel_stale(train_version + 1)
        self._wake.set()
        return [t for g in groups for t in g.trajectories]

    async def _wake_buffer_when(self, event: asyncio.Event | None) -> None:
        """Let the buffer look again when `event` is set (the trainer became idle: a partial batch may go)."""
        if event is not None:
            await event.wait()
            self.buffer.wake()

    def _none_made_stale(self, train_version: int) -> bool:
        """Would taking batch `train_version` now leave every running trajectory fresh for the next one? (By
        its start version — in token mode a conservative answer.) A partial batch is taken only then: it
        discards nothing that could still have joined it, so it costs no generation."""
        fresh = self.policy.version_is_fresh
        # groups in admission order: the oldest first, so a run that would be made stale ends the look early
        return all(fresh(run.start_version, train_version + 1) for g in self.groups.by_id.values() if not g.closed
                   for run in g.runs.values() if not run.settled)

    def _group_completed(self, group: Group) -> None:
        if self.pacer is not None:
            self.pacer.completed(group.group_id, group.domain, self.clock())

    async def _failure_raised(self) -> NoReturn:
        """Raises the scheduler's failure once there is one (what a wait for a batch must not outlive)."""
        await self._failed.wait()
        assert self.failure is not None
        raise self.failure

    # --- the admission loop --------------------------------------------------------------------------
    async def _admission_loop(self) -> None:
        while True:
            self._wake.clear()
            admitted = 0
            while not self.paused and (group := self.admission.next_group()) is not None:
                domain, seq, seed = group
                if self.pacer is not None:
                    self.pacer.admitted(f"g{seq:06d}", self.clock())
                await self.collection.launch_group(domain, self.admission.domains[domain].env, seq, seed,
                                                   self._cohort)
                admitted += 1
            if admitted:
                self._cohort += 1
            if self.failure is None:
                self._announce_upcoming()
            await self._wake.wait()

    def _announce_upcoming(self) -> None:
        """Tell the runner which group admission will likely take next (`TrajectoryRunner.expect`), once per
        group to come, so its envs can be prepared while admission waits for room (a batch training, a group
        finishing). A hint: a runner that fails or is slow to take it costs a warning, never the run."""
        if self._announced is not None and self.admission.upcoming_seq() == self._announced[1]:
            return  # one forecast per sequence number: a guess that flips between domains is not told twice
        upcoming = self.admission.forecast()
        if upcoming is None:
            return
        self._announced = upcoming
        domain, seq, seed = upcoming
        group_id = f"g{seq:06d}"
        task = Task(f"{group_id}/0", domain, self.admission.domains[domain].env, seed, group_id)
        size = self.cfg.group_size + self.cfg.redundancy.extra_per_group
        self._in_background(self._expect(UpcomingGroup(task, size)))

    async def _expect(self, group: UpcomingGroup) -> None:
        try:
            await asyncio.wait_for(self.runner.expect(group), EXPECT_TIMEOUT_S)
        except Exception as exc:
            log.warning("the forecast of group %s did not reach the env plane: %s: %s", group.task.group_id,
                        type(exc).__name__, exc)

    def _in_background(self, coro: Any) -> None:
        """Run `coro` as a task the scheduler keeps (an unreferenced task may be collected mid-flight) and
        whose failure is logged rather than lost."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        self._task_done(task, f"a background task of the scheduler ({task.get_name()})")

    # --- ledger, status, metrics, state --------------------------------------------------------------
    def check_ledger(self) -> list[str]:
        """Violations of 'every trajectory ends exactly once': a fate set twice, or out of order."""
        return self.ledger.check()

    def describe(self) -> str:
        running = self.groups.running_by_domain()
        filtered = f", {self.counts['filtered']} filtered" if self.collection.group_filter is not None else ""
        return (
            f"Scheduler: version {self.inference_version}, next batch {self.next_train_version}, "
            f"{sum(running.values())} trajectories running ({dict(running)}), "
            f"{self.pending_groups()} groups pending of {self.allowed_groups()} allowed"
            f"{', admission paused' if self.paused else ''}; "
            f"so far {self.counts['completed']} completed, {self.counts['failed']} failed, "
            f"{self.counts['aborted']} aborted, {self.counts['stale']} stale{filtered}."
        )

    def metrics(self) -> dict[str, float]:
        c, collection = self.counts, self.collection
        out: dict[str, float] = {
            "rollout/started": c["started"],
            "rollout/completed": c["completed"],
            "rollout/running": sum(len(g.running()) for g in self.groups.open()),
            # the most at once since the run began, stragglers of closed groups (being cancelled) included
            "rollout/running_peak": self.groups.unsettled_peak,
            "rollout/groups_completed": c["groups_completed"],
            "rollout/groups_dropped": c["groups_dropped"],
            "rollout/replacements": c["replacements"],
            "buffer/ready_trajectories": self.buffer.ready_trajectories(),
            "buffer/aborted": c["aborted"],
            "buffer/stale": c["stale"],
            "buffer/failed": c["failed"],
            "buffer/duplicates_refused": self.buffer.duplicates_refused,
            "buffer/ledger_violations": len(self.ledger.violations),  # 'ends exactly once' broken: must stay 0
            "buffer/wasted_tokens": collection.wasted_tokens,
            "buffer/wasted_env_s": collection.wasted_env_s,
            # the adaptive batch: the share of rollout.batch_size the last batch held (1.0: a full batch)
            "rollout/batch_fraction": (c["batch_groups"] / c["batch_groups_nominal"]
                                       if c["batch_groups_nominal"] else 1.0),
            "rollout/batches_partial": c["batches_partial"],
            **(self.pacer.metrics() if self.pacer is not None else {}),
        }
        for d in self.weights:
            out[f"rollout/mix_actual/{d}"] = c[f"mix_actual/{d}"]
            out[f"rollout/mix_target/{d}"] = c[f"mix_target/{d}"]
        if collection.group_filter is not None:
            out["rollout/groups_filtered"] = sum(c[f"groups_filtered/{d}"] for d in self.weights)
            out["rollout/filter_bypassed"] = c["filter_bypassed"]
            for d in self.weights:
                out[f"rollout/groups_filtered/{d}"] = c[f"groups_filtered/{d}"]
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on where this one stands, as JSON data (scheduler_state.py)."""
        admission = self.admission
        running = tuple(sorted(((g.domain, g.seq, g.seed) for g in self.groups.open()), key=lambda x: x[1]))
        return SchedulerState(admission.next_seq, admission.rng.getstate(), running, dict(admission.ordinals),
                              tuple(self.buffer.ready_groups), self.collection.filtered_this_batch).to_json()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        decoded = decode_state(state)
        admission = self.admission
        admission.next_seq = decoded.next_seq
        admission.rng.setstate(decoded.rng)
        admission.replay = list(decoded.replay)
        admission.ordinals = Counter(decoded.ordinals)
        self.collection.filtered_this_batch = decoded.filtered
        for group in decoded.ready:  # scored, not trained: back into the buffer as they were
            for t in group.trajectories:
                self.ledger.restore_ready(t.trajectory_id)
            self.buffer.put(group)
