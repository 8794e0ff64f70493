"""EnvRouter: the env plane's `TrajectoryRunner` over N EnvWorker actors.

In: Ray actor handles of `EnvWorker`s, or (with `EnvRouter.place`) the resource plane's `WorkerSet` of them on
the `env` pool — then the workers are the worker set's membership view, which the resource plane keeps
whole (a dead worker leaves it, its replacement joins it). Out: `run(task, start_version)` → the finished
Trajectory; `cancel(trajectory_id, status, reason)`; `progress()` → {trajectory_id: oldest token version or
None}; `stats()`.

Calls to a worker: a trajectory's `run` goes in the worker's batched form (`EnvWorker.submit`/`take`: the runs
started in one loop iteration as one message, each trajectory back as soon as it ends); the rest one call each.

Routing: a new trajectory goes to the alive worker with the fewest trajectories in flight from this router
object; its id (`Task.trajectory_id`) is remembered until `run` returns, so `cancel` reaches the right
worker — even if the cancel overtakes the `run` call (the worker remembers it). A forecast group (`expect`) is
assigned to workers ahead, and its members go to those workers, whose warm pools staged their envs. A cancel for an id this
object never started (e.g. from a copy of the router) is sent to every worker.
Domains with `env_servers` are served by env servers it places first (`rollart/envs/serving/fleet.py`), which the
env workers reach as remote envs. Used from the driver's asyncio loop (Ray ObjectRefs are awaited); picklable (the placed worker set, which
only the creating process may shut down, is left behind: a copy routes over the workers placed first).

Failures: a worker that dies ends the `run` calls it held with `WorkerDied` naming it (the control plane
ends those trajectories FAILED and replaces them with the same seed) and is reported to its worker set at
once, so no new trajectory goes to it; `cancel`, `progress` and `stats` go on past a dead worker. With no
worker alive, `run` waits for one to join, at most `wait_for_worker_s`.

Guarantees: `cancel`, `progress` and `stats` wait at most `call_timeout_s`; `run` waits as long as the
trajectory runs (the worker bounds every env and LLM wait; the control plane bounds the whole trajectory).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter, OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from rollart.base.batched_calls import CallBatcher
from rollart.config import RunConfig
from rollart.envs.reset_stats import ResetStats
from rollart.resources.errors import WorkerDied
from rollart.resources.health import death_cause, gather_alive, is_worker_death
from rollart.types import EndScorer, SamplingParams, Status, Task, Trajectory, TurnBarrier, UpcomingGroup

log = logging.getLogger(__name__)

MAX_RESERVED_GROUPS = 16  # forecast groups whose members' workers are remembered


class EnvRouter:
    def __init__(self, workers: Sequence[Any], call_timeout_s: float = 30.0, worker_set: Any = None,
                 wait_for_worker_s: float = 300.0) -> None:
        if not workers:
            raise ValueError("EnvRouter needs at least one EnvWorker handle")
        self.workers = list(workers)
        self.call_timeout_s = call_timeout_s
        self.wait_for_worker_s = wait_for_worker_s
        self.worker_set = worker_set  # a rollart.resources WorkerSet when made by `place`: the membership view
        self._where: dict[str, Any] = {}  # trajectory id → the handle running it
        # worker name → (its handle, the batcher of the runs sent to it); a replacement (same name, new handle) gets
        # a batcher of its own
        self._batchers: dict[str, tuple[Any, CallBatcher]] = {}
        self._channel = uuid.uuid4().hex
        self._load: Counter[str] = Counter()  # worker name → trajectories in flight from here
        self.reset_stats = ResetStats()  # every worker's resets, drained into it by reset_metrics()
        self.fleets: dict[str, Any] = {}  # domain → the EnvServerFleet serving it (domains.<d>.env_servers)
        # the domains whose workers have a warm pool to stage a forecast group's envs in (None: not known, every
        # forecast is told); for the others a worker's `expect` does nothing, so it is not sent (an actor call)
        self.staging: frozenset[str] | None = None
        # (domain, split, seed) of a forecast group → the workers told to stage its members' envs, one per member
        self._reserved: OrderedDict[tuple[str, str, int], list[str]] = OrderedDict()

    @classmethod
    def place(
        cls,
        resources: Any,
        cfg: RunConfig,
        llm: Any,
        turn_barrier: TurnBarrier | None = None,
        model_path: str | Path | None = None,
        end_scorer: EndScorer | None = None,
    ) -> EnvRouter:
        """Place `cfg.envs.workers` EnvWorkers with `resources` (a `rollart.resources` Resources; pool from
        `@affinity("env")` unless `roles.env` says otherwise) and return the router over them. `llm` is
        what the workers generate with: an `LLMClient`, or a Ray actor handle (the LLMProxy's) they wrap
        in an `ActorLLMClient`, or a list of those (the proxy's shards: `as_llm_client`). `end_scorer`: each worker gets a copy, and scores its domains' trajectories
        as they end (`EnvWorker`)."""
        from rollart.envs.serving.fleet import EnvServerFleet, ServerDirectory
        from rollart.envs.worker import EnvWorker

        fleets: dict[str, EnvServerFleet] = {}
        try:
            managed = [d for d, dc in cfg.domains.items() if dc.env_servers]
            directory = resources.spawn(ServerDirectory, name="env_server_directory") if managed else None
            for domain in managed:
                fleets[domain] = EnvServerFleet.place(resources, cfg, domain, directory)
            worker_set = resources.place(
                EnvWorker,
                replicas=cfg.envs.workers,
                kwargs={"cfg": cfg, "llm": llm, "turn_barrier": turn_barrier, "model_path": str(model_path) if model_path else None,
                        "env_servers": {d: directory for d in fleets}, "end_scorer": end_scorer},
                worker_kwargs=lambda p: {"name": p.worker},
            )
        except BaseException:
            for fleet in fleets.values():
                fleet.shutdown()
            raise
        # a replacement may take a placement and a constructor to join
        wait = cfg.cluster.placement_timeout_s + cfg.cluster.start_timeout_s + cfg.cluster.health_interval_s
        for actor in worker_set.actors:
            actor.ready.remote()  # warm pools begin filling before the first trajectory arrives
        router = cls(list(worker_set.actors), worker_set=worker_set, wait_for_worker_s=wait)
        router.fleets = fleets
        router.staging = frozenset(d for d, dc in cfg.domains.items() if cfg.envs.pooled(d, dc) and d not in fleets)
        return router

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(worker_set=None, _where={}, _load=Counter(), fleets={}, _reserved=OrderedDict(), _batchers={},
                     _channel=uuid.uuid4().hex)  # a copy is a caller of its own
        return state

    def members(self) -> list[tuple[str, Any]]:
        """(name, handle) of every alive worker."""
        if self.worker_set is not None:
            return [(m.worker, m.actor) for m in self.worker_set.members()]
        return [(f"env#{i}", w) for i, w in enumerate(self.workers)]

    async def run(self, task: Task, start_version: int, sampling: SamplingParams | None = None) -> Trajectory:
        """Run one episode on the least-loaded worker; `sampling` overrides the domain's parameters."""
        trajectory_id = task.trajectory_id
        if trajectory_id in self._where:
            raise ValueError(f"trajectory {trajectory_id} is already running in this router")
        members = await self._alive()
        name, handle = self._reserved_for(task, members) or min(members, key=lambda m: self._load[m[0]])
        self._where[trajectory_id] = handle
        self._load[name] += 1
        try:
            return await self._batcher(name, handle).call((task, start_version, sampling))
        except Exception as exc:
            if not is_worker_death(exc):
                raise
            self._report_dead(handle, exc)
            raise WorkerDied(name, death_cause(exc)) from exc
        finally:
            self._where.pop(trajectory_id, None)
            self._load[name] -= 1

    def _batcher(self, name: str, handle: Any) -> CallBatcher:
        """The runs sent to one worker in one loop iteration go as one message, each trajectory coming back
        with the first `take` after it ends (`rollart.base.batched_calls`): an actor call per trajectory cost the
        driver and the worker more CPU than the rest of a single-turn trajectory's bookkeeping."""
        entry = self._batchers.get(name)
        if entry is None or entry[0] is not handle:
            channel = self._channel
            entry = self._batchers[name] = (handle, CallBatcher(lambda items: handle.submit.remote(channel, items),
                                                                lambda: handle.take.remote(channel)))
        return entry[1]

    def _reserved_for(self, task: Task, members: list[tuple[str, Any]]) -> tuple[str, Any] | None:
        """An alive worker that was told to stage this task's env (`expect`), taken off the reservation."""
        key = (task.domain, task.split, task.seed)
        names, alive = self._reserved.get(key), dict(members)
        while names:
            name = names.pop(0)
            if not names:
                del self._reserved[key]
            if name in alive:
                return name, alive[name]
        return None

    async def expect(self, group: UpcomingGroup) -> None:
        """A forecast group (`TrajectoryRunner.expect`): its members are assigned to the least-loaded alive
        workers now, each told how many envs of the task to stage, and its trajectories go there when they
        come (to another worker if that one has died). Bounded: reservations of the last
        `MAX_RESERVED_GROUPS` forecasts are kept. A domain with no warm pool (`staging`) is not told to the workers:
        there it would stage nothing."""
        members = self.members()
        if not members:
            return
        load = Counter({name: self._load[name] for name, _ in members})
        chosen: list[str] = []
        for _ in range(group.size):
            name = min(load, key=lambda n: load[n])
            load[name] += 1
            chosen.append(name)
        task = group.task
        key = (task.domain, task.split, task.seed)
        self._reserved[key] = chosen
        self._reserved.move_to_end(key)
        while len(self._reserved) > MAX_RESERVED_GROUPS:
            self._reserved.popitem(last=False)
        if self.staging is not None and task.domain not in self.staging:
            return  # no warm pool there: the members still go where they were assigned
        handles = dict(members)
        targets = [(handles[name], count) for name, count in Counter(chosen).items()]
        try:
            await gather_alive({i: h.expect.remote(replace(group, size=count)) for i, (h, count) in enumerate(targets)},
                               self.call_timeout_s, lambda i, exc: self._report_dead(targets[i][0], exc))
        except TimeoutError:
            log.warning("forecast of group %s: env workers did not answer within %gs", task.group_id,
                        self.call_timeout_s)

    async def _alive(self) -> list[tuple[str, Any]]:
        """The alive workers; with none, wait for one to join (at most `wait_for_worker_s`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_for_worker_s
        while not (members := self.members()):
            if loop.time() > deadline:
                raise RuntimeError(f"no env worker alive and none joined within {self.wait_for_worker_s:g} s")
            await asyncio.sleep(0.2)
        return members

    def _report_dead(self, handle: Any, exc: BaseException) -> None:
        if self.worker_set is not None:
            self.worker_set.report_dead(handle, death_cause(exc))

    async def cancel(self, trajectory_id: str, status: Status, reason: str) -> None:
        handle = self._where.get(trajectory_id)
        if handle is not None:
            targets, args = [handle], (trajectory_id, status, reason, True)
        else:
            targets, args = [h for _, h in self.members()], (trajectory_id, status, reason)
        try:
            await self._on_alive(targets, lambda w: w.cancel.remote(*args))
        except TimeoutError:
            log.warning("cancel of %s: env workers did not answer within %gs", trajectory_id, self.call_timeout_s)

    async def progress(self) -> dict[str, int | None]:
        merged: dict[str, int | None] = {}
        for part in await self._on_alive([h for _, h in self.members()], lambda w: w.progress.remote()):
            merged.update(part)
        return merged

    async def reset_metrics(self) -> dict[str, float]:
        """Per-domain reset metrics (`ResetStats.metrics`), after draining every alive worker's records (the
        workers that do not answer within `call_timeout_s` are drained next time)."""
        try:
            drains = await self._on_alive([h for _, h in self.members()], lambda w: w.drain_reset_stats.remote())
        except TimeoutError:
            log.warning("reset metrics: env workers did not answer within %gs", self.call_timeout_s)
            drains = []
        for drained in drains:
            self.reset_stats.add(drained)
        return self.reset_stats.metrics()

    async def stats(self) -> list[dict[str, Any]]:
        return await self._on_alive([h for _, h in self.members()], lambda w: w.stats.remote())

    async def _on_alive(self, handles: list[Any], call: Callable[[Any], Any]) -> list[Any]:
        """`call(handle)` on each worker at once, bounded: the answers of those alive (a dead one — its
        trajectories are gone with it — is reported and skipped; other errors are raised)."""
        answers = await gather_alive({i: call(h) for i, h in enumerate(handles)}, self.call_timeout_s,
                                     lambda i, exc: self._report_dead(handles[i], exc))
        return list(answers.values())

    def shutdown(self, close_timeout_s: float = 30.0) -> None:
        """Let the placed workers close what they hold (their trajectories, warm pools — workspaces and their
        containers — and gateways; at most `close_timeout_s` together), then kill them and the env servers and
        free their pool slots (only for a router made by `place`). A worker that does not close in time is killed
        anyway: what it held is reaped by the next env worker (`reap_leftovers`)."""
        if self.worker_set is not None:
            import ray

            refs = [handle.shutdown.remote() for _, handle in self.members()]
            try:
                ray.wait(refs, num_returns=len(refs), timeout=close_timeout_s)
            except Exception as exc:  # a worker already gone: nothing of it to close
                log.warning("env workers' shutdown: %s: %s", type(exc).__name__, exc)
            self.worker_set.shutdown()
            self.worker_set = None
        for fleet in self.fleets.values():
            fleet.shutdown()
        self.fleets = {}
