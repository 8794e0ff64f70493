"""Collection: running an admitted group's trajectories, and taking the finished ones into the buffer.

In: the rollout config, a `TrajectoryRunner` (env plane), a `RewardScorer` (reward plane), the `SampleBuffer`,
the `StalenessPolicy`, the `Groups` and the `Ledger`, an optional `TurnBarrier` and the algorithm's group filter
(a `GroupFilter`, or None to keep every group) with its per-batch bound; from the scheduler: `spawn` (run a
coroutine as a kept background task), `wake` (admission may have room) and `on_trip` (a domain's circuit
breaker tripped). Out: complete, scored groups in the buffer; the counters of everything else.

- `launch_group` starts `group_size + redundancy.extra_per_group` trajectories of an admitted group. Each runs
  under one timeout (`trajectory_timeout_s`), is scored as soon as it ends — alone, or with its group for a
  domain whose reward takes a batch (group_scoring.py) — and joins its group.
- A group completes with its first `group_size` scored trajectories; the stragglers are cancelled at once
  (generation aborted, env closed). A FAILED member is replaced by a new trajectory with the same seed (at
  most `group_size` replacements), else the group is dropped.
- The group filter (DAPO's dynamic sampling) is asked about each complete group: a group it rejects is
  FILTERED in the ledger, counted per domain, and its slot freed — admission starts a new group in its place.
  At most `max_filtered` groups are dropped while one batch forms; past that the rest of that batch's groups
  are taken unfiltered (one log line says so), so rollout can never spin on a filter nothing passes.
- `cancel_stale` (when a batch is taken): every running trajectory that can serve no later batch is STALE.
- Wasted work (response tokens and env time of everything not trained) is counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Callable

from rollart.base.deadlines import Deadlines
from rollart.config import RolloutConfig
from rollart.control.breaker import DomainBreaker, Trip
from rollart.control.buffer import ReadyGroup, SampleBuffer
from rollart.control.group_scoring import GroupScoring
from rollart.control.groups import Group, Groups, Run
from rollart.control.ledger import Fate, Ledger
from rollart.control.staleness import StalenessPolicy
from rollart.types import GroupFilter, RewardScorer, Span, Status, Task, Trajectory, TrajectoryRunner, TurnBarrier

log = logging.getLogger("rollart.control")


class Collection:
    def __init__(self, rollout: RolloutConfig, runner: TrajectoryRunner, scorer: RewardScorer,
                 buffer: SampleBuffer, policy: StalenessPolicy, groups: Groups, ledger: Ledger,
                 counts: Counter[str], *, spawn: Callable[[Any], None], watch: Callable[[asyncio.Task, str], None],
                 wake: Callable[[], None],
                 on_trip: Callable[[Trip], None], turn_barrier: TurnBarrier | None = None,
                 trajectory_timeout_s: float = 3600.0, clock: Callable[[], float], group_filter: GroupFilter | None = None,
                 max_filtered: int = 0, on_complete: Callable[[Group], None] | None = None) -> None:
        """`on_complete(group)`: told when a group completes into the buffer (admission pacing measures it)."""
        self.cfg = rollout
        self.runner, self.scorer, self.buffer, self.policy = runner, scorer, buffer, policy
        self.groups, self.ledger, self.counts = groups, ledger, counts
        self.spawn, self.watch, self.wake, self.on_trip = spawn, watch, wake, on_trip
        self.turn_barrier = turn_barrier
        self.trajectory_timeout_s = trajectory_timeout_s
        self._trajectory_deadlines = Deadlines(trajectory_timeout_s)
        self.clock = clock
        self.group_filter, self.max_filtered = group_filter, max_filtered
        self.on_complete = on_complete
        self.filtered_this_batch = 0  # groups the filter dropped while the next batch forms
        self.bypassed_this_batch = 0  # complete groups it would have dropped past the bound, taken anyway
        self.breaker = DomainBreaker(rollout.circuit_breaker)
        self.scoring = GroupScoring(scorer, spawn)
        self.wasted_tokens = 0
        self.wasted_env_s = 0.0
        self.inference_version = 0  # the version a trajectory started now runs under (the scheduler sets it)
        buffer.on_drop = self._on_buffer_drop

    # --- launching -----------------------------------------------------------------------------------
    async def launch_group(self, domain: str, env: str, seq: int, seed: int, cohort: int) -> None:
        group = Group(group_id=f"g{seq:06d}", seq=seq, domain=domain, env=env, seed=seed, cohort=cohort)
        self.groups.hold(group)
        self.counts["groups_started"] += 1
        for _ in range(self.cfg.group_size + self.cfg.redundancy.extra_per_group):
            await self.launch_trajectory(group)

    async def launch_trajectory(self, group: Group) -> None:
        if group.closed:
            return  # a replacement its group's end overtook (completed, stale, dropped or stopped): never started
        task = Task(trajectory_id=f"{group.group_id}/{group.launched}", domain=group.domain, env=group.env,
                    seed=group.seed, group_id=group.group_id)
        group.launched += 1
        run = Run(task, self.inference_version)
        self.groups.add_run(group, run)
        self.ledger.move(task, Fate.RUNNING, expect=None)
        self.counts["started"] += 1
        if self.turn_barrier:
            try:
                await self.turn_barrier.join(task.trajectory_id, group.cohort)
            except BaseException:  # the barrier broke, or the launch was cancelled (stop): it never runs
                self._end_unstarted(group, run, Status.ABORTED, "never started: joining the turn barrier failed")
                raise
        run.handle = asyncio.create_task(self._run_one(group, run), name=task.trajectory_id)
        self.watch(run.handle, f"the task of trajectory {task.trajectory_id}")

    def _end_unstarted(self, group: Group, run: Run, status: Status, reason: str) -> None:
        """`run` was entered in the ledger but its task never began (its turn-barrier join failed): it ends
        untrained, its slot freed."""
        self.groups.settle(run)
        del group.runs[run.task.trajectory_id]
        self.ledger.move(run.task, Fate.untrained(status), expect=Fate.RUNNING, reason=reason)
        self.counts[status.value] += 1
        if group.closed and not group.runs:
            self.groups.release(group)
        self.wake()

    # --- one trajectory ------------------------------------------------------------------------------
    async def _run_one(self, group: Group, run: Run) -> None:
        task, version = run.task, run.start_version
        trajectory_id = task.trajectory_id
        try:
            try:
                if group.closed:  # closed before this task first ran (or while it joined the turn barrier): the
                    # cancel sent then reached no runner, so it must not start
                    traj = Trajectory(trajectory_id, task, version).finished(group.close_status, group.close_reason)
                else:
                    async with self._trajectory_deadlines.bound():  # (in this task; one timer for every run)
                        traj = await self.runner.run(task, version)
            except TimeoutError:
                await self.runner.cancel(trajectory_id, Status.ABORTED, "trajectory timeout")
                reason = f"timed out after {self.trajectory_timeout_s:.0f}s"
                traj = Trajectory(trajectory_id, task, version).finished(Status.FAILED, reason)
            except Exception as exc:  # the runner itself broke: the trajectory fails, the run goes on
                traj = Trajectory(trajectory_id, task, version).finished(Status.FAILED, f"runner: {exc!r}")
            if traj.trajectory_id != trajectory_id:
                self.ledger.violations.append(f"runner returned id {traj.trajectory_id} for task {trajectory_id}")
            if traj.status is not None and traj.status.trainable and not group.closed:
                traj = await self._score(group, traj)
            self._on_finished(group, run, traj)
        finally:
            self.groups.settle(run)  # (a run cancelled before its outcome was known)
            del group.runs[trajectory_id]
            self.scoring.poke(group.group_id, lambda: self._scoring_state(group))
            if group.closed and not group.runs:
                self.groups.release(group)
            if self.turn_barrier:
                await self.turn_barrier.leave(trajectory_id)
            self.wake()

    async def _score(self, group: Group, traj: Trajectory) -> Trajectory:
        start = self.clock()
        try:
            result = await self.scoring.score(traj, lambda: self._scoring_state(group, traj.trajectory_id))
        except Exception as exc:
            return traj.finished(Status.FAILED, f"reward raised: {exc!r}")
        if result is None:  # its group closed while it waited for the group's scoring
            return traj
        if not result.ok:
            return traj.finished(Status.FAILED, f"reward failed after {result.attempts} tries: {result.error}",
                                 fault=result.fault)
        span = Span("reward", start, self.clock(), worker=f"reward/reward/{result.backend}")
        return traj.scored(result.reward, spans=(span,), details=result.details)

    def _scoring_state(self, group: Group, finishing: str = "") -> tuple[int, int]:
        """(scored members the group still needs, its other members still running) for `self.scoring`."""
        waiting = self.scoring.waiting(group.group_id) | {finishing}
        running = sum(1 for tid, run in group.runs.items() if not run.settled and tid not in waiting)
        return self.cfg.group_size - len(group.scored), running

    def _close(self, group: Group, status: Status, reason: str) -> None:
        """The group closes (groups.py): members waiting for its group's scoring are not scored."""
        self.groups.close(group, status, reason)
        self.scoring.drop(group.group_id)

    def _on_finished(self, group: Group, run: Run, traj: Trajectory) -> None:
        self.groups.settle(run)
        trip = self.breaker.record(traj)
        if trip is not None:
            self.on_trip(trip)
        status = traj.status or Status.FAILED
        if group.closed and status.trainable:
            # finished in the instant between the group closing and its cancel arriving
            status, traj = group.close_status, traj.finished(group.close_status, group.close_reason)
        if status.trainable and traj.reward is not None:
            group.scored.append(traj)
            self.counts["completed"] += 1
            if len(group.scored) == self.cfg.group_size:
                self._complete_group(group)
            return
        self._end_untrained(traj, status)
        if status is Status.FAILED and not group.closed:
            self._after_failure(group)

    def _complete_group(self, group: Group) -> None:
        # in admission order, not completion order: equal inputs give bit-equal batches (float sums included)
        members = tuple(sorted(group.scored, key=lambda t: int(t.trajectory_id.rsplit("/", 1)[1])))
        reason = self.group_filter(members) if self.group_filter is not None else None
        if reason is not None and self.filtered_this_batch < self.max_filtered:
            self._filter(group, members, reason)
            return
        if reason is not None:
            self.counts["filter_bypassed"] += 1
            if self.bypassed_this_batch == 0:
                log.info("dynamic sampling: %d groups were dropped while this batch formed "
                         "(train.max_filtered_groups); the rest of it is taken unfiltered", self.filtered_this_batch)
            self.bypassed_this_batch += 1
        self._close(group, Status.ABORTED, "redundant: group full")
        for t in group.scored:
            self.ledger.move(t, Fate.READY, expect=Fate.RUNNING)
        self.buffer.put(ReadyGroup(group.group_id, group.seq, group.domain, members))
        self.counts["groups_completed"] += 1
        if self.on_complete is not None:
            self.on_complete(group)
        for trajectory_id in group.running():
            self._spawn_cancel(trajectory_id, Status.ABORTED, "redundant: group full")

    def _filter(self, group: Group, members: tuple[Trajectory, ...], reason: str) -> None:
        """The algorithm's filter dropped the complete group: FILTERED, counted; its slot frees for a new one."""
        self._close(group, Status.ABORTED, f"filtered: {reason}")
        for t in members:
            self.ledger.move(t, Fate.FILTERED, expect=Fate.RUNNING, reason=reason)
            self.counts["filtered"] += 1
            self._count_waste(t)
        group.scored.clear()
        self.filtered_this_batch += 1
        self.counts[f"groups_filtered/{group.domain}"] += 1
        for trajectory_id in group.running():
            self._spawn_cancel(trajectory_id, Status.ABORTED, "redundant: group filtered")
        self.wake()

    def batch_taken(self) -> None:
        """A batch was taken: the next one's filter bound starts afresh."""
        self.filtered_this_batch = self.bypassed_this_batch = 0

    def _after_failure(self, group: Group) -> None:
        if len(group.scored) + len(group.running()) >= self.cfg.group_size:
            return  # redundancy still covers it
        if group.replacements < self.cfg.group_size:
            group.replacements += 1
            self.counts["replacements"] += 1
            self.spawn(self.launch_trajectory(group))
            return
        self.counts["groups_dropped"] += 1
        self.spawn(self.cancel_group(group, Status.ABORTED, "group dropped: too many failures"))

    def _end_untrained(self, traj: Trajectory, status: Status) -> None:
        self.ledger.move(traj, Fate.untrained(status), expect=Fate.RUNNING, reason=traj.status_reason)
        self.counts[status.value] += 1
        self._count_waste(traj)
        log.debug("trajectory %s ended %s: %s", traj.trajectory_id, status.value, traj.status_reason)

    def _count_waste(self, traj: Trajectory) -> None:
        self.wasted_tokens += traj.num_response_tokens
        spans = list(traj.spans) + [s for t in traj.turns for s in t.spans]
        self.wasted_env_s += sum(s.duration for s in spans if s.name.startswith("env."))

    # --- cancellation --------------------------------------------------------------------------------
    def _spawn_cancel(self, trajectory_id: str, status: Status, reason: str) -> None:
        self.spawn(self.runner.cancel(trajectory_id, status, reason))

    async def cancel_group(self, group: Group, status: Status, reason: str) -> None:
        if group.closed:
            # Closed since the caller chose it (stop() and cancel_stale await between groups, a drop runs in the
            # background): complete — its members are READY in the buffer — filtered, or already cancelled.
            return
        self._close(group, status, reason)
        for traj in group.scored:
            self._end_untrained(traj, status)
        group.scored.clear()
        await asyncio.gather(*(self.runner.cancel(t, status, reason) for t in group.running()))

    async def cancel_stale(self, next_train_version: int) -> None:
        progress = await self.runner.progress() if self.policy.mode == "token" else {}
        for group in self.groups.open():
            for trajectory_id in group.running():
                if self.policy.mode == "token":
                    v = progress.get(trajectory_id)
                else:
                    v = group.runs[trajectory_id].start_version
                if not self.policy.version_is_fresh(v, next_train_version):
                    await self.cancel_group(group, Status.STALE, f"stale for batch {next_train_version}")
                    break
        self.buffer.drop_stale(next_train_version)

    def _on_buffer_drop(self, group: ReadyGroup, reason: str) -> None:
        for t in group.trajectories:
            self.ledger.move(t, Fate.STALE, expect=Fate.READY, reason=reason)
            self.counts["stale"] += 1
            self._count_waste(t)
        # its admission slot is free: with nothing else running, no other event would wake admission
        self.wake()
