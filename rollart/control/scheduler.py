"""RolloutScheduler: which episodes run, when they may start, when they are cancelled.

In: the rollout and domain config, a `TrajectoryRunner` (env plane), a `RewardScorer` (reward plane), a
`SampleBuffer`, a `StalenessPolicy`, and from the driver the inference version it serves and the batches
it takes. Out: complete, scored GRPO groups in the buffer; counters of everything else.

What it does:
- Samples a task domain per group (by `domains.<d>.weight`; `stratified` keeps the pending mix on target),
  gives the group a seed — a dataset domain's groups take its rows in order, so their seed is the domain's
  ordinal (0, 1, 2 …: the env maps it to a row of the epoch's shuffle) — and starts `group_size + redundancy.extra_per_group` trajectories of it.
- Forecast: whenever admission stops to wait, the group it would admit next (domain, seed; a guess when
  several domains compete) is told to the runner once (`TrajectoryRunner.expect`), so the env plane can
  prepare that group's envs while it waits (a warm pool stages the task's files ahead).
- Admission (staleness.py (2)): pending groups (running or ready) ≤ window × (groups per batch incl.
  `extra_groups`), so pending trajectories ≤ (α + 1) × (batch size + redundancy) and nothing is started
  that could only ever be stale.
- A group completes with its first `group_size` scored trajectories; the stragglers are cancelled at once
  (generation aborted, env closed: unlike ROLL, which lets them run). A FAILED member is replaced by a new
  trajectory with the same seed (at most `group_size` replacements), else the group is dropped.
- When batch b is taken, every running trajectory that can serve no batch ≥ b+1 is cancelled as STALE.
- Wasted work (response tokens and env time of everything not trained) is counted, and each batch's domain
  mix is reported against the target, so completion-order bias is visible.

Guarantee (the ledger): every trajectory started ends exactly once — trained, or ABORTED / FAILED / STALE
with a reason; `check_ledger()` returns the violations (none, in every test). Every move of the ledger is
also written, as it happens, to the `LedgerSink` the scheduler is given (the run's ledger file; started,
ready, trained, aborted, failed, stale — with the group, the reason, and a digest of what was generated).
Without a sink (the cluster twin, the rollout benchmark) no entry is built at all.

Failure: a background task of the scheduler that raises (the admission loop, a cancel, a replacement, a
trajectory's own task) — or a failure reported with `fail()` — stops rollout: the batch the driver waits
for (or asks for next) raises `SchedulerFailed` at once, naming the task, with the task's own exception
and traceback as its cause. A worker's death is not such a failure: the trajectory ends FAILED and is
replaced with the same seed. A domain whose own code keeps failing (the per-domain circuit breaker,
breaker.py: `rollout.circuit_breaker`) stops rollout the same way, with `DomainBroken` — the domain, the
count and its first error with its traceback — within seconds instead of a batch timeout.

Checkpoints: `state_dict()` holds the groups scored but not yet trained (each trajectory as JSON,
`rollart.base.codec`), the sequence numbers and seeds of the groups still running and each dataset domain's next
ordinal; a resumed run puts the former back in the buffer as they were (they are trained once, never
generated again), re-admits the running ones with their seeds, and goes on with the next row of each dataset.

Bookkeeping — one structure, `_groups`, and the ledger `fate`:
- `_groups` holds each group from its admission until it is closed (complete, dropped, stale or stopped)
  AND the last of its trajectories has returned from its runner; so a group holds its admission slot while
  a cancelled straggler winds down, and `pending_by_domain` is `_groups` plus the buffer's ready groups.
- `group.runs` holds the group's trajectories whose runner call has not returned, each a `_Run` (its task,
  start version, asyncio task, and whether its outcome is settled). A trajectory is running exactly when
  it has an unsettled run (`group.running()`); `group.scored` are the members scored while the group was
  open, waiting for the group to fill. `unsettled` counts the unsettled runs of every group, open or closed
  (kept by `_launch_trajectory` and `_settle`), and `unsettled_peak` is its highest value so far.
- `fate[trajectory_id]` (a `Fate`) is written once when a trajectory starts (RUNNING) and moves only
  forward: RUNNING → READY → TRAINED, or RUNNING / READY → ABORTED | FAILED | STALE. A move from any other
  fate is a ledger violation.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NoReturn

from rollart.base.background import unless_fails
from rollart.base.codec import from_json, to_json
from rollart.config import DomainConfig, RolloutConfig
from rollart.control.breaker import DomainBreaker, Trip
from rollart.control.buffer import ReadyGroup, SampleBuffer, domain_quotas
from rollart.control.group_scoring import GroupScoring
from rollart.control.staleness import StalenessPolicy
from rollart.types import (
    LedgerSink,
    RewardScorer,
    Span,
    Status,
    Task,
    Trajectory,
    TrajectoryRunner,
    TurnBarrier,
    UpcomingGroup,
)

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


def trajectory_digest(traj: Trajectory) -> str:
    """A short hash of what a trajectory generated and scored (tokens, logprobs, versions, reward): equal
    for the same trajectory restored from a checkpoint, different for one generated again."""
    content = [[t.prompt_token_ids, t.response_token_ids, t.logprobs, t.versions] for t in traj.turns]
    return hashlib.sha256(json.dumps([content, traj.reward]).encode()).hexdigest()[:16]


class Fate(str, enum.Enum):
    """Where a started trajectory stands in the ledger (see the module docstring for the moves)."""

    RUNNING = "running"  # started, no outcome yet (a scored member waits here for its group to fill)
    READY = "ready"  # in a complete group in the buffer
    TRAINED = "trained"  # taken into a batch
    ABORTED = "aborted"
    FAILED = "failed"
    STALE = "stale"

    @classmethod
    def untrained(cls, status: Status) -> Fate:
        """The fate of a trajectory that ended with `status` without being trained."""
        return {Status.ABORTED: cls.ABORTED, Status.FAILED: cls.FAILED, Status.STALE: cls.STALE}[status]


@dataclass
class _Run:
    """One trajectory of a group whose runner call has not returned yet."""

    task: Task
    start_version: int
    handle: asyncio.Task | None = None  # the `_run_one` task (None while it joins the turn barrier)
    settled: bool = False  # its outcome is known: scored, or ended untrained


@dataclass
class _Group:
    group_id: str
    seq: int
    domain: str
    env: str
    seed: int
    cohort: int
    runs: dict[str, _Run] = field(default_factory=dict)  # by trajectory id
    scored: list[Trajectory] = field(default_factory=list)
    launched: int = 0
    replacements: int = 0
    closed: bool = False
    close_status: Status = Status.ABORTED
    close_reason: str = ""

    def running(self) -> list[str]:
        """Ids of the members still running (outcome not settled)."""
        return [trajectory_id for trajectory_id, run in self.runs.items() if not run.settled]


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
    ) -> None:
        """`ledger_sink`: where each ledger move is written as it happens (see the module docstring); the ledger
        itself (`fate`, `check_ledger`) is kept either way."""
        self.cfg = rollout
        self.domains = {d: c for d, c in domains.items() if c.weight > 0}
        self.weights = {d: c.weight for d, c in self.domains.items()}
        self.runner, self.scorer, self.buffer, self.policy = runner, scorer, buffer, policy
        self.end_version = first_version + total_batches  # the last batch trains at end_version - 1
        self.turn_barrier = turn_barrier
        self.trajectory_timeout_s = trajectory_timeout_s
        self.clock = clock
        self.ledger_sink = ledger_sink
        self.seed = seed
        self.rng = random.Random(seed)
        self.groups_per_batch = rollout.batch_size // rollout.group_size + rollout.redundancy.extra_groups
        # per-domain groups per batch (stratified admission): the batch's quota plus a share of the extras
        batch_q = domain_quotas(self.weights, rollout.batch_size // rollout.group_size)
        extra_q = domain_quotas(self.weights, rollout.redundancy.extra_groups)
        self.admission_quotas = {d: batch_q.get(d, 0) + extra_q.get(d, 0) for d in self.weights}
        self.inference_version = first_version
        self.next_train_version = first_version  # batches are named by the version they train at
        self.paused = False
        self.next_seq = 0
        self._groups: dict[str, _Group] = {}  # admitted, until closed and every member returned
        self._held_by_domain: Counter[str] = Counter()  # _groups per domain (kept by _hold/_release)
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()  # cancels, replacements, drops: kept until done
        self._cohort = 0
        self.unsettled = self.unsettled_peak = 0  # trajectories started and not settled: now, and at most
        self._announced: tuple[str, int, int] | None = None  # the last forecast told the runner
        self._replay: list[tuple[str, int, int]] = []  # (domain, seq, seed) of groups to re-admit after a resume
        self.ordinals: Counter[str] = Counter()  # per dataset domain: groups drawn so far (its next row)
        self.failure: SchedulerFailed | None = None
        self._failed = asyncio.Event()
        self.breaker = DomainBreaker(rollout.circuit_breaker)
        self.scoring = GroupScoring(scorer, self._in_background)
        # ledger and counters
        self.fate: dict[str, Fate] = {}  # trajectory id → where it stands (every trajectory ever started)
        self.violations: list[str] = []
        self.counts: Counter[str] = Counter()
        self.wasted_tokens = 0
        self.wasted_env_s = 0.0
        buffer.on_drop = self._on_buffer_drop

    # --- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._admission_loop(), name="rollart-admission")
        self._loop_task.add_done_callback(lambda task: self._task_done(task, "the admission loop"))

    def fail(self, error: BaseException, what: str) -> None:
        """Stop rollout: `what` failed with `error` (the first failure wins; see the module doc)."""
        if self.failure is not None:
            return
        self.failure = SchedulerFailed(f"{what} failed: {type(error).__name__}: {error}")
        self.failure.__cause__ = error
        log.error("rollout stops: %s", self.failure, exc_info=error)
        self._stop_admitting()

    def _stop_admitting(self) -> None:
        """Rollout is over: the batch waited for raises `self.failure`, and nothing new starts."""
        self.paused = True
        self._failed.set()

    def _task_done(self, task: asyncio.Task, what: str) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception(), what)

    async def stop(self, reason: str = "shutdown", timeout_s: float = 60.0) -> None:
        """Cancel everything running (ABORTED) and wait, at most `timeout_s`, until each trajectory has
        ended; what is still running then is cancelled locally and logged."""
        self.paused = True
        if self._loop_task:
            self._loop_task.cancel()
        for g in self._open_groups():
            await self._cancel_group(g, Status.ABORTED, reason)
        runs = {r.handle for g in self._groups.values() for r in g.runs.values() if r.handle is not None}
        pending = runs | self._background
        if pending:
            _, late = await asyncio.wait(pending, timeout=timeout_s)
            for task in late:
                task.cancel()
            if late:
                log.warning("scheduler stop: %d tasks did not end within %.0fs and were cancelled", len(late),
                            timeout_s)

    # --- driver hooks --------------------------------------------------------------------------------
    def set_inference_version(self, version: int) -> None:
        self.inference_version = version
        self._wake.set()

    def pause_admission(self) -> None:
        self.paused = True

    def resume_admission(self) -> None:
        self.paused = False
        self._wake.set()

    async def get_batch(self, train_version: int) -> list[Trajectory]:
        """Steps 1 of the loop: block until batch `train_version` is ready, take it, cancel what is stale."""
        if self.failure is not None:
            raise self.failure
        n = self.cfg.batch_size // self.cfg.group_size
        failed = asyncio.ensure_future(self._failure_raised())
        try:
            groups = await unless_fails(self.buffer.take_groups(
                n, train_version, self.cfg.get_batch_timeout_s, describe=self.describe
            ), failed)
        finally:
            failed.cancel()
        for g in groups:
            for t in g.trajectories:
                self._set_fate(t, Fate.TRAINED, expect=Fate.READY, batch=train_version)
        mix = Counter(g.domain for g in groups)
        target = domain_quotas(self.weights, n)
        for d in self.weights:
            self.counts[f"mix_actual/{d}"] = mix.get(d, 0)
            self.counts[f"mix_target/{d}"] = target.get(d, 0)
        self.next_train_version = train_version + 1
        await self._cancel_stale()
        self._wake.set()
        return [t for g in groups for t in g.trajectories]

    async def _failure_raised(self) -> NoReturn:
        """Raises the scheduler's failure once there is one (what a wait for a batch must not outlive)."""
        await self._failed.wait()
        assert self.failure is not None
        raise self.failure

    # --- admission -----------------------------------------------------------------------------------
    def pending_by_domain(self) -> Counter[str]:
        """Groups open or still winding down (a cancelled straggler holds its slot until it has ended),
        plus groups ready in the buffer, per domain."""
        pending = Counter(self._held_by_domain)  # = Counter(g.domain for g in self._groups.values())
        pending.update(self.buffer.ready_by_domain())
        return +pending

    def pending_groups(self) -> int:
        return sum(self.pending_by_domain().values())

    def window(self) -> int:
        return self.policy.admission_window(
            self.inference_version, self.next_train_version, self.end_version - self.next_train_version
        )

    def allowed_groups(self) -> int:
        return self.window() * self.groups_per_batch

    async def _admission_loop(self) -> None:
        while True:
            self._wake.clear()
            admitted = 0
            while not self.paused and (group := self._next_group()) is not None:
                await self._launch_group(*group)
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
        upcoming = self._forecast()
        if upcoming is None or (self._announced is not None and upcoming[1] == self._announced[1]):
            return  # one forecast per sequence number: a guess that flips between domains is not told twice
        self._announced = upcoming
        domain, seq, seed = upcoming
        group_id = f"g{seq:06d}"
        task = Task(f"{group_id}/0", domain, self.domains[domain].env, seed, group_id)
        self._in_background(self._expect(UpcomingGroup(task, self.cfg.group_size + self.cfg.redundancy.extra_per_group)))

    async def _expect(self, group: UpcomingGroup) -> None:
        try:
            await asyncio.wait_for(self.runner.expect(group), EXPECT_TIMEOUT_S)
        except Exception as exc:
            log.warning("the forecast of group %s did not reach the env plane: %s: %s", group.task.group_id,
                        type(exc).__name__, exc)

    def _forecast(self) -> tuple[str, int, int] | None:
        """(domain, seq, seed) of the group `_next_group` would admit next if nothing changed meanwhile — a
        guess (with several domains, another may have room first); nothing is drawn or counted."""
        if self._replay:
            return self._replay[0]
        domains = sorted(self.weights)
        if not domains:
            return None
        if self.cfg.redundancy.selection == "first":
            rng = random.Random()
            rng.setstate(self.rng.getstate())  # the draw `_select_domain` will make, on a copy
            domain = rng.choices(domains, weights=[self.weights[d] for d in domains])[0]
        else:
            pending, window = self.pending_by_domain(), self.window()
            domain = max(domains, key=lambda d: (window * self.admission_quotas[d] - pending[d], -domains.index(d)))
        return domain, self.next_seq, self._seed_of(domain, self.next_seq)

    def _in_background(self, coro: Any) -> None:
        """Run `coro` as a task the scheduler keeps (an unreferenced task may be collected mid-flight) and
        whose failure is logged rather than lost."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        self._task_done(task, f"a background task of the scheduler ({task.get_name()})")

    def _next_group(self) -> tuple[str, int, int] | None:
        """(domain, seq, seed) of the next group to admit, or None when admission must wait: first the groups
        a resumed run replays (under the total bound), then new ones of the domain `_select_domain` picks."""
        if self._replay:
            return self._replay.pop(0) if self._below_total_bound() else None
        domain = self._select_domain()
        if domain is None:
            return None
        self.next_seq += 1
        return domain, self.next_seq - 1, self._new_seed(domain, self.next_seq - 1)

    def _new_seed(self, domain: str, seq: int) -> int:
        """A new group's seed (`_seed_of`), its dataset ordinal counted."""
        seed = self._seed_of(domain, seq)
        if self.domains[domain].data is not None:
            self.ordinals[domain] += 1
        return seed

    def _seed_of(self, domain: str, seq: int) -> int:
        """The seed of the next group of `domain` at sequence number `seq`: a dataset domain's next ordinal (its
        rows in order), else one per sequence number."""
        if self.domains[domain].data is not None:
            return self.ordinals[domain]
        return self.seed * 1_000_003 + seq

    def _below_total_bound(self) -> bool:
        return self.pending_groups() < self.allowed_groups()

    def _select_domain(self) -> str | None:
        """The domain of the next new group, or None when admission must wait.

        `first`: any domain, drawn by weight, while the total bound holds. `stratified`: each domain has
        its own allowance, window × its share of a batch (redundancy included) — so ready groups of one
        domain, over its quota, can never use up the room another domain's quota needs.
        """
        domains = sorted(self.weights)
        if self.cfg.redundancy.selection == "first":
            if not self._below_total_bound():
                return None
            return self.rng.choices(domains, weights=[self.weights[d] for d in domains])[0]
        # No total check here: a domain still over its allowance (admitted under a wider window) must not
        # block the others; each allowance is ≤ (α + 1) × its quota, so the sum keeps the total bound.
        pending = self.pending_by_domain()
        window = self.window()
        room = {d: window * q - pending[d] for d, q in self.admission_quotas.items()}
        best = max(domains, key=lambda d: (room[d], -domains.index(d)))
        return best if room[best] > 0 else None

    async def _launch_group(self, domain: str, seq: int, seed: int) -> None:
        group = _Group(
            group_id=f"g{seq:06d}",
            seq=seq,
            domain=domain,
            env=self.domains[domain].env,
            seed=seed,
            cohort=self._cohort,
        )
        self._hold(group)
        self.counts["groups_started"] += 1
        for _ in range(self.cfg.group_size + self.cfg.redundancy.extra_per_group):
            await self._launch_trajectory(group)

    async def _launch_trajectory(self, group: _Group) -> None:
        task = Task(
            trajectory_id=f"{group.group_id}/{group.launched}",
            domain=group.domain,
            env=group.env,
            seed=group.seed,
            group_id=group.group_id,
        )
        group.launched += 1
        run = group.runs[task.trajectory_id] = _Run(task, self.inference_version)
        self.unsettled += 1
        self.unsettled_peak = max(self.unsettled_peak, self.unsettled)
        self._hold(group)  # (again, if a replacement starts after its group closed and was released)
        self._set_fate(task, Fate.RUNNING, expect=None)
        self.counts["started"] += 1
        if self.turn_barrier:
            await self.turn_barrier.join(task.trajectory_id, group.cohort)
        run.handle = asyncio.create_task(self._run_one(group, run), name=task.trajectory_id)
        run.handle.add_done_callback(lambda done: self._task_done(done, f"the task of trajectory {task.trajectory_id}"))

    # --- one trajectory ------------------------------------------------------------------------------
    async def _run_one(self, group: _Group, run: _Run) -> None:
        task, version = run.task, run.start_version
        trajectory_id = task.trajectory_id
        try:
            try:
                async with asyncio.timeout(self.trajectory_timeout_s):  # (in this task: no second one per run)
                    traj = await self.runner.run(task, version)
            except TimeoutError:
                await self.runner.cancel(trajectory_id, Status.ABORTED, "trajectory timeout")
                reason = f"timed out after {self.trajectory_timeout_s:.0f}s"
                traj = Trajectory(trajectory_id, task, version).finished(Status.FAILED, reason)
            except Exception as exc:  # the runner itself broke: the trajectory fails, the run goes on
                traj = Trajectory(trajectory_id, task, version).finished(Status.FAILED, f"runner: {exc!r}")
            if traj.trajectory_id != trajectory_id:
                self.violations.append(f"runner returned id {traj.trajectory_id} for task {trajectory_id}")
            if traj.status is not None and traj.status.trainable and not group.closed:
                traj = await self._score(group, traj)
            self._on_finished(group, run, traj)
        finally:
            self._settle(run)  # (a run cancelled before its outcome was known)
            del group.runs[trajectory_id]
            self.scoring.poke(group.group_id, *self._scoring_state(group))
            if group.closed and not group.runs:
                self._release(group)
            if self.turn_barrier:
                await self.turn_barrier.leave(trajectory_id)
            self._wake.set()

    async def _score(self, group: _Group, traj: Trajectory) -> Trajectory:
        start = self.clock()
        try:
            result = await self.scoring.score(traj, *self._scoring_state(group, traj.trajectory_id))
        except Exception as exc:
            return traj.finished(Status.FAILED, f"reward raised: {exc!r}")
        if result is None:  # its group closed while it waited for the group's scoring
            return traj
        if not result.ok:
            return traj.finished(Status.FAILED, f"reward failed after {result.attempts} tries: {result.error}",
                                 fault=result.fault)
        span = Span("reward", start, self.clock(), worker=f"reward/reward/{result.backend}")
        return traj.scored(result.reward, spans=(span,), details=result.details)

    def _scoring_state(self, group: _Group, finishing: str = "") -> tuple[int, int]:
        """(scored members the group still needs, its other members still running) for `self.scoring`."""
        waiting = self.scoring.waiting(group.group_id) | {finishing}
        running = sum(1 for tid, run in group.runs.items() if not run.settled and tid not in waiting)
        return self.cfg.group_size - len(group.scored), running

    def _settle(self, run: _Run) -> None:
        if not run.settled:
            run.settled = True
            self.unsettled -= 1

    def _on_finished(self, group: _Group, run: _Run, traj: Trajectory) -> None:
        self._settle(run)
        trip = self.breaker.record(traj)
        if trip is not None and self.failure is None:  # told once, by whoever stops the run (its caller)
            self.failure = DomainBroken(trip)
            log.info("rollout stops: domain %s is broken (%d trajectories failed in its own code)", trip.domain,
                     trip.failed)
            self._stop_admitting()
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

    def _complete_group(self, group: _Group) -> None:
        self._close(group, Status.ABORTED, "redundant: group full")
        for t in group.scored:
            self._set_fate(t, Fate.READY, expect=Fate.RUNNING)
        # in admission order, not completion order: equal inputs give bit-equal batches (float sums included)
        members = tuple(sorted(group.scored, key=lambda t: int(t.trajectory_id.rsplit("/", 1)[1])))
        self.buffer.put(ReadyGroup(group.group_id, group.seq, group.domain, members))
        self.counts["groups_completed"] += 1
        for trajectory_id in group.running():
            self._spawn_cancel(trajectory_id, Status.ABORTED, "redundant: group full")

    def _after_failure(self, group: _Group) -> None:
        if len(group.scored) + len(group.running()) >= self.cfg.group_size:
            return  # redundancy still covers it
        if group.replacements < self.cfg.group_size:
            group.replacements += 1
            self.counts["replacements"] += 1
            self._in_background(self._launch_trajectory(group))
            return
        self.counts["groups_dropped"] += 1
        self._in_background(self._cancel_group(group, Status.ABORTED, "group dropped: too many failures"))

    def _end_untrained(self, traj: Trajectory, status: Status) -> None:
        self._set_fate(traj, Fate.untrained(status), expect=Fate.RUNNING, reason=traj.status_reason)
        self.counts[status.value] += 1
        self._count_waste(traj)
        log.debug("trajectory %s ended %s: %s", traj.trajectory_id, status.value, traj.status_reason)

    def _count_waste(self, traj: Trajectory) -> None:
        self.wasted_tokens += traj.num_response_tokens
        spans = list(traj.spans) + [s for t in traj.turns for s in t.spans]
        self.wasted_env_s += sum(s.duration for s in spans if s.name.startswith("env."))

    # --- cancellation --------------------------------------------------------------------------------
    def _spawn_cancel(self, trajectory_id: str, status: Status, reason: str) -> None:
        self._in_background(self.runner.cancel(trajectory_id, status, reason))

    def _close(self, group: _Group, status: Status, reason: str) -> None:
        """No member of `group` will be trained past this point (the ready ones are in the buffer); it
        keeps its slot in `_groups` until its last member has returned."""
        group.closed, group.close_status, group.close_reason = True, status, reason
        self.scoring.drop(group.group_id)
        if not group.runs:
            self._release(group)

    def _hold(self, group: _Group) -> None:
        """`group` takes its admission slot (counted per domain, so admission checks cost O(domains))."""
        if group.group_id not in self._groups:
            self._groups[group.group_id] = group
            self._held_by_domain[group.domain] += 1

    def _release(self, group: _Group) -> None:
        if self._groups.pop(group.group_id, None) is not None:
            self._held_by_domain[group.domain] -= 1

    def _open_groups(self) -> list[_Group]:
        return [g for g in self._groups.values() if not g.closed]

    async def _cancel_group(self, group: _Group, status: Status, reason: str) -> None:
        if group.closed:
            # Closed since the caller chose it (stop() and _cancel_stale await between groups, a drop runs in
            # the background): complete — its members are READY in the buffer — or already cancelled.
            return
        self._close(group, status, reason)
        for traj in group.scored:
            self._end_untrained(traj, status)
        group.scored.clear()
        await asyncio.gather(*(self.runner.cancel(t, status, reason) for t in group.running()))

    async def _cancel_stale(self) -> None:
        progress = await self.runner.progress() if self.policy.mode == "token" else {}
        for group in self._open_groups():
            for trajectory_id in group.running():
                if self.policy.mode == "token":
                    v = progress.get(trajectory_id)
                else:
                    v = group.runs[trajectory_id].start_version
                if not self.policy.version_is_fresh(v, self.next_train_version):
                    await self._cancel_group(group, Status.STALE, f"stale for batch {self.next_train_version}")
                    break
        self.buffer.drop_stale(self.next_train_version)

    def _on_buffer_drop(self, group: ReadyGroup, reason: str) -> None:
        for t in group.trajectories:
            self._set_fate(t, Fate.STALE, expect=Fate.READY, reason=reason)
            self.counts["stale"] += 1
            self._count_waste(t)
        # its admission slot is free: with nothing else running, no other event would wake admission
        self._wake.set()

    # --- ledger, status, metrics, state --------------------------------------------------------------
    def _set_fate(self, record: Trajectory | Task, fate: Fate, expect: Fate | None, reason: str = "",
                  batch: int | None = None) -> None:
        """Move a trajectory (or the task it starts from) in the ledger, and write the move to the ledger sink."""
        trajectory_id = record.trajectory_id
        current = self.fate.get(trajectory_id)
        if current != expect:
            self.violations.append(
                f"{trajectory_id}: {current and current.value} → {fate.value} (expected from {expect and expect.value})"
            )
        self.fate[trajectory_id] = fate
        if self.ledger_sink is None:
            return
        task = record.task if isinstance(record, Trajectory) else record
        entry: dict[str, Any] = {"time": self.clock(), "id": trajectory_id, "group": task.group_id,
                                 "domain": task.domain, "fate": fate.value}
        if reason:
            entry["reason"] = reason
        if fate in (Fate.READY, Fate.TRAINED):
            entry["digest"] = trajectory_digest(record)  # type: ignore[arg-type]
        if batch is not None:
            entry["batch"] = batch
        self.ledger_sink.write(entry)

    def check_ledger(self) -> list[str]:
        """Violations of 'every trajectory ends exactly once': a fate set twice, or out of order."""
        return list(self.violations)

    def describe(self) -> str:
        running = Counter(g.domain for g in self._open_groups() for _ in g.running())
        return (
            f"Scheduler: version {self.inference_version}, next batch {self.next_train_version}, "
            f"{sum(running.values())} trajectories running ({dict(running)}), "
            f"{self.pending_groups()} groups pending of {self.allowed_groups()} allowed"
            f"{', admission paused' if self.paused else ''}; "
            f"so far {self.counts['completed']} completed, {self.counts['failed']} failed, "
            f"{self.counts['aborted']} aborted, {self.counts['stale']} stale."
        )

    def metrics(self) -> dict[str, float]:
        c = self.counts
        out: dict[str, float] = {
            "rollout/started": c["started"],
            "rollout/completed": c["completed"],
            "rollout/running": sum(len(g.running()) for g in self._open_groups()),
            # the most at once since the run began, stragglers of closed groups (being cancelled) included
            "rollout/running_peak": self.unsettled_peak,
            "rollout/groups_completed": c["groups_completed"],
            "rollout/groups_dropped": c["groups_dropped"],
            "rollout/replacements": c["replacements"],
            "buffer/ready_trajectories": self.buffer.ready_trajectories(),
            "buffer/aborted": c["aborted"],
            "buffer/stale": c["stale"],
            "buffer/failed": c["failed"],
            "buffer/duplicates_refused": self.buffer.duplicates_refused,
            "buffer/ledger_violations": len(self.violations),  # 'ends exactly once' broken: must stay 0
            "buffer/wasted_tokens": self.wasted_tokens,
            "buffer/wasted_env_s": self.wasted_env_s,
        }
        for d in self.weights:
            out[f"rollout/mix_actual/{d}"] = c[f"mix_actual/{d}"]
            out[f"rollout/mix_target/{d}"] = c[f"mix_target/{d}"]
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on where this one stands, as JSON data: the groups scored but not
        trained (`ready`: `ReadyGroup`s with their trajectories, see `rollart.base.codec`), the groups still
        running (`replay`: (domain, seq, seed), admitted again in order: exact for α = 0), the next sequence
        number, each dataset domain's next ordinal and the domain sampler's state."""
        running = sorted([[g.domain, g.seq, g.seed] for g in self._open_groups()], key=lambda x: x[1])
        return {"next_seq": self.next_seq, "rng": _json_rng(self.rng.getstate()), "replay": running,
                "ordinals": dict(self.ordinals), "ready": [to_json(g) for g in self.buffer.ready_groups]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        decoded = decode_state(state)
        self.next_seq = decoded.next_seq
        self.rng.setstate(decoded.rng)
        self._replay = list(decoded.replay)
        self.ordinals = Counter(decoded.ordinals)
        for group in decoded.ready:  # scored, not trained: back into the buffer as they were
            for t in group.trajectories:
                self.fate[t.trajectory_id] = Fate.READY  # (written to the ledger by the run that scored them)
            self.buffer.put(group)


@dataclass(frozen=True)
class DecodedState:
    """A `RolloutScheduler.state_dict()` read back: what `load_state_dict` applies."""

    next_seq: int
    rng: tuple
    replay: tuple[tuple[str, int, int], ...]  # (domain, seq, seed)
    ordinals: dict[str, int]  # each dataset domain's next row ordinal
    ready: tuple[ReadyGroup, ...]


def decode_state(state: Mapping[str, Any]) -> DecodedState:
    """Read a scheduler state (from a checkpoint: data, not trusted) without applying it; ValueError naming
    the field that does not read back — the driver's pre-check runs it before anything starts."""
    def field_of(name: str) -> Any:
        if name not in state:
            raise ValueError(f"field 'scheduler.{name}' is missing")
        return state[name]

    try:
        next_seq = field_of("next_seq")
        if not isinstance(next_seq, int) or isinstance(next_seq, bool) or next_seq < 0:
            raise ValueError(f"field 'scheduler.next_seq' must be an integer ≥ 0, got {next_seq!r:.80}")
        raw = field_of("rng")
        try:
            rng = (raw[0], tuple(raw[1]), raw[2])
            random.Random().setstate(rng)
        except (TypeError, ValueError, IndexError, OverflowError) as exc:
            raise ValueError(f"field 'scheduler.rng' is not a random.Random state ({exc})") from None
        raw_replay, raw_ordinals = field_of("replay"), field_of("ordinals")
        try:
            replay = tuple((str(d), int(seq), int(seed)) for d, seq, seed in raw_replay)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"field 'scheduler.replay' must be [[domain, seq, seed], …] ({exc})") from None
        try:
            ordinals = {str(d): int(n) for d, n in raw_ordinals.items()}
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"field 'scheduler.ordinals' must map domains to row ordinals ({exc})") from None
        ready = state.get("ready", [])
        if not isinstance(ready, list):
            raise ValueError(f"field 'scheduler.ready' must be a list, got {type(ready).__name__}")
        groups = []
        for i, data in enumerate(ready):
            try:
                groups.append(from_json(ReadyGroup, data))
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"field 'scheduler.ready[{i}]' is not a scored group ({exc})") from None
    except TypeError as exc:  # `state` itself is no mapping
        raise ValueError(f"field 'scheduler' must be an object ({exc})") from None
    return DecodedState(next_seq, rng, replay, ordinals, tuple(groups))


def _json_rng(state: tuple) -> list[Any]:
    """`random.Random.getstate()` as JSON data (tuples as lists)."""
    version, internal, gauss = state
    return [version, list(internal), gauss]
