"""EnvRouter: the env plane's `TrajectoryRunner` over N EnvWorker actors.

In: Ray actor handles of `EnvWorker`s (or, with `EnvRouter.place`, the resource plane places
`envs.workers` of them on the `env` pool). Out: `run(task, start_version)` → the finished Trajectory;
`cancel(trajectory_id, status, reason)`; `progress()` → {trajectory_id: oldest token version or None}.

Routing: a new trajectory goes to the worker with the fewest trajectories in flight from this router
object; its id (`Task.trajectory_id`) is remembered until `run` returns, so `cancel` reaches the right
worker — even if the cancel overtakes the `run` call (the worker remembers it). A cancel for an id this
object never started (e.g. from a copy of the router) is sent to every worker.
Used from the driver's asyncio loop (Ray ObjectRefs are awaited); picklable (the placed cluster, which
only the creating process may shut down, is left behind).

Guarantees: `cancel` and `progress` wait at most `call_timeout_s`; `run` waits as long as the trajectory
runs (the worker bounds every env and LLM wait; the control plane bounds the whole trajectory).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Sequence

from rollart.config import RunConfig
from rollart.types import SamplingParams, Status, Task, Trajectory, TurnGate

log = logging.getLogger(__name__)


class EnvRouter:
    def __init__(self, workers: Sequence[Any], call_timeout_s: float = 30.0, cluster: Any = None) -> None:
        if not workers:
            raise ValueError("EnvRouter needs at least one EnvWorker handle")
        self.workers = list(workers)
        self.call_timeout_s = call_timeout_s
        self.cluster = cluster  # a rollart.resources Cluster when made by `place`
        self._where: dict[str, int] = {}
        self._load = [0] * len(self.workers)

    @classmethod
    def place(
        cls,
        resources: Any,
        cfg: RunConfig,
        llm: Any,
        gate: TurnGate | None = None,
        model_path: str | Path | None = None,
    ) -> EnvRouter:
        """Place `cfg.envs.workers` EnvWorkers with `resources` (a `rollart.resources` Resources; pool from
        `@affinity("env")` unless `roles.env` says otherwise) and return the router over them. `llm` is
        what the workers generate with: an `LLMClient`, or a Ray actor handle (the LLMProxy's) they wrap
        in an `ActorLLMClient`."""
        from rollart.envs.worker import EnvWorker

        cluster = resources.place(
            EnvWorker,
            replicas=cfg.envs.workers,
            kwargs={"cfg": cfg, "llm": llm, "gate": gate, "model_path": str(model_path) if model_path else None},
            worker_kwargs=lambda p: {"name": p.worker},
        )
        return cls(list(cluster.actors), cluster=cluster)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(cluster=None, _where={}, _load=[0] * len(self.workers))
        return state

    async def run(self, task: Task, start_version: int, sampling: SamplingParams | None = None) -> Trajectory:
        """Run one episode on the least-loaded worker; `sampling` overrides the domain's parameters."""
        trajectory_id = task.trajectory_id
        if trajectory_id in self._where:
            raise ValueError(f"trajectory {trajectory_id} is already running in this router")
        index = min(range(len(self.workers)), key=self._load.__getitem__)
        self._where[trajectory_id] = index
        self._load[index] += 1
        try:
            return await self.workers[index].run.remote(task, start_version, sampling)
        finally:
            self._where.pop(trajectory_id, None)
            self._load[index] -= 1

    async def cancel(self, trajectory_id: str, status: Status, reason: str) -> None:
        index = self._where.get(trajectory_id)
        if index is not None:
            calls = [self.workers[index].cancel.remote(trajectory_id, status, reason, True)]
        else:
            calls = [w.cancel.remote(trajectory_id, status, reason) for w in self.workers]
        try:
            await asyncio.wait_for(asyncio.gather(*calls), self.call_timeout_s)
        except TimeoutError:
            log.warning("cancel of %s: env workers did not answer within %gs", trajectory_id, self.call_timeout_s)

    async def progress(self) -> dict[str, int | None]:
        parts = await asyncio.wait_for(
            asyncio.gather(*(w.progress.remote() for w in self.workers)), self.call_timeout_s
        )
        merged: dict[str, int | None] = {}
        for part in parts:
            merged.update(part)
        return merged

    async def stats(self) -> list[dict[str, Any]]:
        return list(await asyncio.wait_for(asyncio.gather(*(w.stats.remote() for w in self.workers)), self.call_timeout_s))

    def shutdown(self) -> None:
        """Kill the placed workers and free their pool slots (only for a router made by `place`)."""
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
