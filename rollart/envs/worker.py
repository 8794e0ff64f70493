"""EnvWorker: an environment worker on the `env` hardware pool, running many trajectories at once.

In: the `RunConfig`, an `LLMClient` (or a Ray actor handle with async `generate`/`abort` — the inference
plane's LLMProxy — wrapped here in an `ActorLLMClient`; or a list of them, the proxy's shards, behind a
`ShardedLLMClient`), an optional `TurnBarrier`, the worker's name and the model
checkpoint whose tokenizer/chat template prompts are built with, and an optional `EndScorer` (the reward plane's,
wired by the composition root: the cheap rewards, scored here). Out: `run(task, start_version)` →
the finished `Trajectory` — scored already when its domain is the end scorer's; `cancel`, `progress`, `stats`.

Each `run` is one `EnvManager` driven as an asyncio task on the actor's event loop (Ray runs async actor
methods concurrently), so one worker holds many environment lifecycles; sync env calls go to a thread
pool of `envs.threads` threads so a CPU-heavy env does not stall the others. A task of an agent domain
(`domains.<name>.agent`, or an env kind that runs as one: `verifiers:<taskset>`) runs an `AgentManager` instead: the worker serves those agents an OpenAI-compatible
`AgentGateway` on 127.0.0.1 (started with the worker when the config has an agent domain). The class is
plain Python, placed as a Ray actor by the resource plane (`Resources.place(EnvWorker, ...)`, see
`EnvRouter.place`) and
usable without Ray in tests. Domains with a warm pool (`envs.warm_pool`) reset from envs the worker
prepared in the background — staged with the task of a group the router said is coming (`expect`); every reset is recorded in `reset_stats` (drained by the router's metrics).

Calls: `run`, or its batched form (`submit(channel, items)` + `take(channel)`, many runs per message, each
trajectory handed back with the first `take` after it ends: `rollart.base.batched_calls`), which the env router
uses; `cancel`, `progress`, `expect`, `stats`, `drain_reset_stats`, `ready`, `shutdown`.

Guarantees: a trajectory id runs at most once per worker at a time; a cancel that arrives before its
`run` (a race between two actor calls) is remembered, and that `run` returns at once with the cancel's
status; `run` never raises for env or LLM errors (the trajectory is FAILED with the reason).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollart.base.batched_calls import CallBatcher, Outbox, Outcome
from rollart.config import DomainConfig, RunConfig
from rollart.envs.agents.function import resolve_agent
from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.manager import AgentManager
from rollart.envs.chat import ChatTokens
from rollart.envs.manager import EnvManager
from rollart.envs.protocol import EnvFactory
from rollart.envs.adapters.remote import RemoteEnv
from rollart.envs.reset_stats import ResetStats
from rollart.envs.sampling import domain_sampling
from rollart.envs.seeds import episode_seed
from rollart.envs.sharded_llm import ShardedLLMClient
from rollart.envs.spec import adapter_agent, domain_env_factory, resolve_env
from rollart.envs.warm_pool import WarmPool
from rollart.models import load_tokenizer, resolve_model_path
from rollart.resources import affinity
from rollart.sandbox.workspace import reap_leftovers
from rollart.types import (
    EndScorer,
    GenerationRequest,
    GenerationResult,
    LLMClient,
    SamplingParams,
    Status,
    Task,
    Span,
    Trajectory,
    TurnBarrier,
    UpcomingGroup,
)

MAX_EARLY_CANCELS = 10_000  # remembered cancels of not-yet-started ids (bounded: oldest forgotten)
SHUTDOWN_RUNS_WAIT_S = 15.0  # cancelled trajectories closing their envs (a container removal each) before the pools
TAKE_WAIT_S = 30.0  # how long one `take` waits for a finished trajectory before it answers [] (the router asks again)


class ActorLLMClient:
    """The `LLMClient` over a Ray actor handle whose `generate`/`abort` take the same arguments — how env
    workers reach the inference plane's LLMProxy actor (planes never import each other, so the wrapper
    lives with its user and takes any handle). Picklable. When the handle offers the batched form
    (`submit`/`take`, as the LLMProxy does), the requests made in one event-loop iteration go as one message and
    each result comes back with the first `take` after it exists (`rollart.base.batched_calls`): one actor call
    per request cost more CPU than the rest of a single-turn trajectory's env work."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._batched = hasattr(handle, "submit") and hasattr(handle, "take")
        self._channel = uuid.uuid4().hex
        self._batchers: dict[asyncio.AbstractEventLoop, CallBatcher] = {}  # one per loop (an agent gateway has its own)

    def __getstate__(self) -> dict[str, Any]:
        return {"handle": self.handle}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["handle"])  # type: ignore[misc]  # a copy is a caller of its own: a new channel

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if not self._batched:
            return await self.handle.generate.remote(request)
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None:
            handle, channel = self.handle, self._channel + f"-{len(self._batchers)}"
            batcher = self._batchers[loop] = CallBatcher(lambda items: handle.submit.remote(channel, items),
                                                         lambda: handle.take.remote(channel))
        return await batcher.call(request)

    async def abort(self, trajectory_id: str) -> None:
        await self.handle.abort.remote(trajectory_id)


def as_llm_client(llm: Any) -> LLMClient:
    """A wrapper over a Ray actor handle, else `llm` itself when it implements `LLMClient`; a list of them (the
    shards of a sharded LLM proxy, `inference.proxy_shards`): a `ShardedLLMClient` over their clients."""
    import ray

    if isinstance(llm, (list, tuple)):
        clients = [as_llm_client(shard) for shard in llm]
        return clients[0] if len(clients) == 1 else ShardedLLMClient(clients)
    if isinstance(llm, ray.actor.ActorHandle):  # checked first: a handle has every method name as attribute
        return ActorLLMClient(llm)
    if isinstance(llm, LLMClient):
        return llm
    raise TypeError(f"EnvWorker needs an LLMClient (async generate/abort) or a Ray actor handle, got {type(llm).__name__}")


@affinity("env", role="env")
class EnvWorker:
    def __init__(
        self,
        cfg: RunConfig,
        llm: Any,
        turn_barrier: TurnBarrier | None = None,
        name: str = "env/env/0",
        model_path: str | Path | None = None,
        env_servers: dict[str, Any] | None = None,
        end_scorer: EndScorer | None = None,
    ) -> None:
        self.cfg, self.name, self.turn_barrier = cfg, name, turn_barrier
        self.end_scorer = end_scorer if end_scorer is not None and end_scorer.domains else None
        if self.end_scorer is not None:
            self.end_scorer.start()  # in this process: its pools start now, not on the first trajectory
        self.llm = as_llm_client(llm)
        path = model_path or resolve_model_path(cfg.model, cfg.seed)
        tokenizer = load_tokenizer(path, cfg.model.trust_remote_code)
        self.chat = ChatTokens(tokenizer)  # agents bring their own messages (and system prompts)
        self.chats = {d: ChatTokens(tokenizer, c.system_prompt, c.thinking) for d, c in cfg.domains.items()
                      if not c.runs_agent}
        self.executor = ThreadPoolExecutor(cfg.envs.threads, thread_name_prefix=name.replace("/", "-"))
        reap_leftovers()  # workspace sandboxes a dead predecessor (a worker killed mid-trajectory) left
        # checked now, so a bad spec (or a dataset with no row left) fails at start-up rather than mid-run
        self._factories: dict[str, EnvFactory] = {
            d: domain_env_factory(d, c, self.chats[d], cfg.seed, cfg.envs.workspace) for d, c in cfg.domains.items() if not c.runs_agent
        }
        for domain, directory in (env_servers or {}).items():  # rollart's own env servers (rollart/envs/serving/fleet.py)
            self._factories[domain] = functools.partial(RemoteEnv, directory=directory, domain=domain)
        # agent domains: a user's function, or an env kind whose trajectories a program runs (verifiers:<taskset>)
        self._agents = {d: resolve_agent(c.agent) if c.agent else adapter_agent(c)
                        for d, c in cfg.domains.items() if c.runs_agent}
        self.gateway = (
            AgentGateway(self.llm, self.chat, cfg.envs.gateway, worker=name,
                         generate_timeout_s=self._generate_timeout_s()).start()
            if self._agents else None
        )
        pool_cfg = cfg.envs.warm_pool
        self.pools = {
            d: WarmPool(d, factory, pool_cfg.size, executor=self.executor, prepare_timeout_s=pool_cfg.prepare_timeout_s,
                        backoff_s=cfg.envs.retry_backoff_s, backoff_max_s=cfg.envs.retry_backoff_max_s,
                        parallel=pool_cfg.parallel)
            for d, factory in self._factories.items()
            if cfg.envs.pooled(d, cfg.domains[d]) and d not in (env_servers or {})  # those servers pool themselves
        }
        self.reset_stats = ResetStats()
        self._managers: dict[str, EnvManager | AgentManager] = {}
        self._early_cancels: OrderedDict[str, tuple[Status, str]] = OrderedDict()
        self._counts = {"started": 0, "finished": 0}
        self._outbox = Outbox()  # the env router's batched runs (`submit`/`take`)

    def _domain_cfg_and_factory(self, task: Task) -> tuple[DomainConfig, EnvFactory]:
        domain_cfg = self.cfg.domains.get(task.domain)
        if domain_cfg is None:
            raise ValueError(
                f"{self.name}: task {task.trajectory_id} has domain {task.domain!r}, not one of {sorted(self.cfg.domains)}"
            )
        if task.env == domain_cfg.env and task.domain in self._factories:
            return domain_cfg, self._factories[task.domain]
        # a task may name another env than its domain's: the domain's limits, that env without options
        return domain_cfg.model_copy(update={"env": task.env, "options": {}}), resolve_env(task.env)

    def _generate_timeout_s(self) -> float:
        # the proxy bounds admission and generation itself; this only guards a proxy that never answers
        return self.cfg.inference.admission_timeout_s + self.cfg.inference.request_timeout_s + 60.0

    def manager(
        self, task: Task, start_version: int, sampling: SamplingParams | None = None
    ) -> EnvManager | AgentManager:
        """What a `run` of `task` drives: an EnvManager, or an AgentManager for an agent domain."""
        agent = self._agents.get(task.domain)
        if agent is None:
            domain_cfg, factory = self._domain_cfg_and_factory(task)
        chat = self.chats.get(task.domain, self.chat)
        if sampling is None:
            sampling = domain_sampling(self.cfg, task.domain, chat.stop_token_ids, task.split, task.temperature)
        if agent is not None:
            assert self.gateway is not None
            return AgentManager(task, start_version, agent=agent, domain_cfg=self.cfg.domains[task.domain],
                               gateway=self.gateway, sampling=sampling, turn_barrier=self.turn_barrier, worker=self.name)
        own_env = task.env == domain_cfg.env  # a task naming another env is not served from the domain's pool
        pool = self.pools.get(task.domain) if own_env else None
        if pool is not None:
            pool.start()
        return EnvManager(
            task,
            start_version,
            make_env=factory,
            pool=pool,
            reset_stats=self.reset_stats,
            domain_cfg=domain_cfg,
            envs=self.cfg.envs,
            llm=self.llm,
            chat=chat,
            sampling=sampling,
            executor=self.executor,
            turn_barrier=self.turn_barrier,
            worker=self.name,
            generate_timeout_s=self._generate_timeout_s(),
        )

    async def run(self, task: Task, start_version: int, sampling: SamplingParams | None = None) -> Trajectory:
        """Run one episode to its end; `sampling` overrides the domain's (e.g. a different temperature)."""
        trajectory_id = task.trajectory_id
        if trajectory_id in self._managers:
            raise ValueError(f"{self.name}: trajectory {trajectory_id} is already running here")
        manager = self.manager(task, start_version, sampling)
        early = self._early_cancels.pop(trajectory_id, None)
        self._managers[trajectory_id] = manager
        self._counts["started"] += 1
        try:
            if early is not None:
                await manager.cancel(*early)
            trajectory = await manager.run()
        finally:
            self._managers.pop(trajectory_id, None)
            self._counts["finished"] += 1
        return await self._score_at_end(trajectory)

    async def submit(self, channel: str, items: list[tuple[int, tuple[Task, int, SamplingParams | None]]]) -> None:
        """`run` for each (sequence number, (task, start_version, sampling)), answered through `take(channel)`
        — the batched form the env router uses (`rollart.base.batched_calls`)."""
        self._outbox.start(channel, [(seq, self.run(*args)) for seq, args in items])

    async def take(self, channel: str, wait_s: float = TAKE_WAIT_S) -> list[Outcome]:
        """The trajectories of `channel`'s submitted runs ended since its last `take` (waits for one)."""
        return await self._outbox.take(channel, wait_s)

    async def _score_at_end(self, trajectory: Trajectory) -> Trajectory:
        """The trajectory scored here when its domain's reward is the end scorer's and it ended trainable (a
        reward that kept failing ends it FAILED, as the control plane would); else as it is."""
        scorer, status = self.end_scorer, trajectory.status
        if scorer is None or trajectory.domain not in scorer.domains or status is None or not status.trainable:
            return trajectory
        began = time.time()
        result = await scorer.score(trajectory)
        if not result.ok:
            return trajectory.finished(Status.FAILED, f"reward failed after {result.attempts} tries: {result.error}")
        span = Span("reward", began, time.time(), worker=self.name)
        return trajectory.scored(result.reward, spans=(span,), details=result.details)

    async def cancel(self, trajectory_id: str, status: Status, reason: str, expected: bool = False) -> None:
        """Cancel a running trajectory (no-op if unknown or finished). `expected=True` means the caller
        knows it was sent here: if its `run` has not arrived yet, it is cancelled on arrival."""
        manager = self._managers.get(trajectory_id)
        if manager is not None:
            await manager.cancel(status, reason)
        elif expected:
            self._early_cancels[trajectory_id] = (status, reason)
            while len(self._early_cancels) > MAX_EARLY_CANCELS:
                self._early_cancels.popitem(last=False)

    async def progress(self) -> dict[str, int | None]:
        return {trajectory_id: m.progress() for trajectory_id, m in self._managers.items()}

    async def expect(self, group: UpcomingGroup) -> None:
        """A group forecast to run here (`UpcomingGroup`, from the router): the domain's warm pool, if it has
        one, stages `group.size` envs of its task ahead of their resets."""
        task = group.task
        domain_cfg, pool = self.cfg.domains.get(task.domain), self.pools.get(task.domain)
        if pool is not None and domain_cfg is not None and task.env == domain_cfg.env:
            pool.expect(episode_seed(task), group.size)

    async def stats(self) -> dict[str, Any]:
        pools = {d: {"ready": p.ready, **p.counts} for d, p in self.pools.items()}
        return {"worker": self.name, "in_flight": len(self._managers), **self._counts, "pools": pools}

    async def drain_reset_stats(self) -> dict[str, Any]:
        """The reset records since the last drain (`ResetStats.drain`), for the router's metrics."""
        return self.reset_stats.drain()

    async def ready(self) -> str:
        """The worker's name, once it can take trajectories; its warm pools begin filling now."""
        for pool in self.pools.values():
            pool.start()
        return self.name

    async def shutdown(self) -> None:
        """Cancel every running trajectory (ABORTED) and wait for them to close their envs, close the warm pools,
        stop the gateway and the thread pool."""
        await asyncio.gather(*(m.cancel(Status.ABORTED, "env worker shutdown") for m in list(self._managers.values())))
        # a cancelled run closes its env on its way out: wait for that (bounded) before this actor is killed, or a
        # container it held outlives the run until the next start reaps it
        deadline = time.monotonic() + SHUTDOWN_RUNS_WAIT_S
        while self._managers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.gather(*(pool.close() for pool in self.pools.values()))
        if self.gateway is not None:
            await asyncio.to_thread(self.gateway.stop)
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(self.executor.shutdown, wait=False))
        if self.end_scorer is not None:
            self.end_scorer.close()
