"""Builds every plane's objects from a `RunConfig` and wires them together — the driver's hands.

In: a validated `RunConfig` and a started `rollart.resources.Runtime`. Out: a `System` holding the weight
store, the trainer group, one inference cluster per generation pool behind the LLM proxy, the env router
(over the env workers), the reward router, the control plane and the `RunState` a resumed run continues from; plus the few
operations the driver's loop is made of: `sync_weights` (steps 2–5), `train_step` (step 6, in a thread so
rollout goes on), `evaluate`, `warm_start`, `save_checkpoint`. The phases the driver times return
`TimedMetrics` (metrics and their timeline span).

Only this module (with `driver.py`) imports more than one plane; planes meet here through the protocols of
`rollart.types`. Every wait is bounded (`_bounded`), and `close()` stops everything `build_system`
started, in reverse order, even after a failure.

Failures: the resource plane keeps the clusters whole (a dead worker is replaced, an elastic pool grows);
this module passes what it learns on — an inference worker that died leaves the LLM proxy's routing, one
that joined is added to it (the proxy has it pull the served weights first) — and keeps every death, join
and trainer rebuild as an `incident` (a timeline mark the recorder draws on the Gantt charts). What cannot
be recovered stops rollout at once, naming it (the driver's next batch raises): no env worker left and none
can be placed, or a domain with no inference worker on any pool of its chain and none can be placed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from rollart.algo import PolicyObjective, build_train_batch
from rollart.config import RunConfig
from rollart.control import (
    RolloutScheduler,
    SampleBuffer,
    StalenessPolicy,
    TurnBarrier,
    TurnGateClient,
)
from rollart.envs.agents.demonstrations import demonstrate_agent
from rollart.envs.chat import ChatTokens
from rollart.envs.expert import demonstrate
from rollart.envs.router import EnvRouter
from rollart.inference.proxy import LLMProxy
from rollart.inference.worker import InferenceWorker, gpus_per_worker
from rollart.models import load_tokenizer, resolve_model_path
from rollart.observability.timeline import Mark
from rollart.resources import Cluster, Resources, Runtime
from rollart.resources.cluster import MemberEvent
from rollart.reward.router import RewardRouter, new_run_id
from rollart.trainer import TrainerGroup, latest_checkpoint
from rollart.types import Evaluation, RunState, Span, Task, TimedMetrics, Trajectory
from rollart.weights import WeightStore

log = logging.getLogger("rollart")
T = TypeVar("T")

# timeline lanes of the driver's own phases
DRIVER_LANE = "control/driver/0"
TRAINER_LANE = "trainer/train/0"


async def _bounded(awaitable: Awaitable[T], timeout_s: float, what: str) -> T:
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except asyncio.TimeoutError:
        raise TimeoutError(f"{what} did not finish within {timeout_s:.0f}s") from None


@dataclass
class System:
    cfg: RunConfig
    resources: Resources
    model_path: Path
    store: WeightStore | None  # None when built for evaluation only
    trainer: TrainerGroup | None
    inference: dict[str, Cluster]  # by hardware pool name
    proxy: Any  # LLMProxy actor handle
    env_router: EnvRouter
    reward: RewardRouter
    gate: TurnGateClient | None
    resumed: RunState = field(default_factory=RunState)  # from the checkpoint resumed (fresh run: step 0)
    scheduler: RolloutScheduler | None = None
    served_version: int = 0
    incidents: list[Mark] = field(default_factory=list)  # deaths, joins, rebuilds (appended from any thread)
    _stack: ExitStack = field(default_factory=ExitStack)
    _loop: asyncio.AbstractEventLoop | None = None  # the driver's, where the scheduler lives
    _unrecoverable: tuple[BaseException, str] | None = None  # found before rollout started

    # --- keeping the planes in step with the resource plane ---------------------------------------------
    def watch_membership(self) -> None:
        """Follow every cluster's deaths and joins (see the module doc)."""
        for cluster in self.inference.values():
            cluster.on_change(self._inference_changed)
        if self.env_router.cluster is not None:
            self.env_router.cluster.on_change(self._env_changed)
        if self.trainer is not None:
            self.trainer.on_change(self._record)

    def _inference_changed(self, event: MemberEvent) -> None:
        self._record(event)
        if event.kind == "unplaced":
            alive = {m.placement.pool for cluster in self.inference.values() for m in cluster.members()}
            stranded = sorted(d for d, dc in self.cfg.domains.items()
                              if not {dc.pool, *self.cfg.pools[dc.pool].fallback} & alive)
            if stranded:
                self._stop_rollout(RuntimeError(f"no inference worker is left for domains {stranded} (their pools "
                                                f"and fallbacks) and none can be placed: {event.cause}"),
                                   f"inference (worker {event.worker})")
            return
        if event.kind == "died":
            ref = self.proxy.remove_worker.remote(event.actor._actor_id.hex(), event.cause)
        else:
            ref = self.proxy.add_worker.remote(event.pool, event.actor)
        ref.future().add_done_callback(lambda done: done.exception() and log.error(
            "LLMProxy could not %s %s: %s", "drop" if event.kind == "died" else "add", event.worker,
            done.exception()))

    def _env_changed(self, event: MemberEvent) -> None:
        self._record(event)
        if event.kind == "unplaced" and not self.env_router.members():
            self._stop_rollout(RuntimeError(f"no env worker is left and none can be placed: {event.cause}"),
                               f"the env workers ({event.worker} died)")

    def _record(self, event: MemberEvent) -> None:
        detail = event.cause or f"on pool {event.pool}"
        name = {"unplaced": "worker not replaced"}.get(event.kind, f"worker {event.kind}")
        self.incidents.append(Mark(name, time.time(), event.worker, detail))

    def _stop_rollout(self, error: BaseException, what: str) -> None:
        """Stop the rollout from any thread (the scheduler lives on the driver's loop)."""
        if self.scheduler is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.scheduler.fail, error, what)
        elif self._unrecoverable is None:
            self._unrecoverable = (error, what)

    async def metrics(self) -> dict[str, float]:
        """The planes' counters for a step record: rollout and buffer, reward, pools, turn retries, trainer
        restarts, env resets per domain."""
        proxy = await _bounded(self.proxy.stats.remote(), 30, "LLMProxy.stats")
        resets = await _bounded(self.env_router.reset_metrics(), 60, "EnvRouter.reset_metrics")
        return {**(self.scheduler.metrics() if self.scheduler else {}), **self.reward.metrics(), **resets,
                **self.resources.metrics(), "rollout/turn_retries": float(proxy["turn_retries"]),
                **({"train/restarts": float(self.trainer.restarts)} if self.trainer else {})}

    def start_rollout(self, steps_left: int) -> RolloutScheduler:
        """Create and start the control plane: batches from the trainer's current version on."""
        cfg = self.cfg
        policy = StalenessPolicy(cfg.rollout.alpha, cfg.rollout.staleness)
        weights = {domain: domain_cfg.weight for domain, domain_cfg in cfg.domains.items() if domain_cfg.weight > 0}
        buffer = SampleBuffer(policy, cfg.rollout.redundancy.selection, weights)
        self.scheduler = RolloutScheduler(
            cfg.rollout, cfg.domains, self.env_router, self.reward, buffer, policy, total_batches=steps_left,
            first_version=self.trainer.version, seed=cfg.seed, gate=self.gate,
            trajectory_timeout_s=max(domain_cfg.max_turns for domain_cfg in cfg.domains.values())
            * (cfg.inference.request_timeout_s + cfg.envs.step_timeout_s),
        )
        self.scheduler.set_inference_version(self.served_version)
        if self.resumed.scheduler is not None:
            self.scheduler.load_state_dict(self.resumed.scheduler)
        self._loop = asyncio.get_running_loop()
        self.scheduler.start()
        if self._unrecoverable is not None:
            self.scheduler.fail(*self._unrecoverable)
        return self.scheduler

    # --- steps 2–5: suspend, update, resume (in-flight requests are re-prefilled by the engines) ------
    async def sync_weights(self, version: int) -> TimedMetrics:
        """Serve `version` on every engine (nothing to do, and no span, when it is served already)."""
        if version <= self.served_version:
            return TimedMetrics({})
        timeout = self.cfg.inference.request_timeout_s
        start = time.perf_counter()
        await _bounded(self.proxy.suspend.remote(), timeout, "LLMProxy.suspend")
        try:
            timings = await _bounded(self.proxy.update_weights_to.remote(version), timeout,
                                     f"update of the inference workers to version {version}")
        finally:
            await _bounded(self.proxy.resume.remote(), timeout, "LLMProxy.resume")
        exposed = time.perf_counter() - start
        end = time.time()
        self.served_version = version
        if self.scheduler:
            self.scheduler.set_inference_version(version)
        pulls = [t.get("pull_s", 0.0) for t in timings.values()]
        return TimedMetrics({"time/weights.exposed": exposed, "time/weights.pull": max(pulls, default=0.0)},
                            Span("weights.sync", end - exposed, end, DRIVER_LANE))

    # --- step 6: one train step, while rollout goes on ------------------------------------------------
    async def train_step(self, trajectories: list[Trajectory], version: int) -> TimedMetrics:
        """One optimizer step of the trainer on these trajectories, at policy `version` (it publishes
        version + 1); in a thread, so the event loop (and with it the rollout) goes on."""
        batch = build_train_batch(trajectories, version, self.cfg.train)
        start = time.time()
        metrics = await asyncio.to_thread(self.trainer.train_step, batch)
        return TimedMetrics(metrics, Span("train", start, time.time(), TRAINER_LANE))

    def run_state(self, step: int, scheduler_state: Any, eval_first: Any, ledger_bytes: int) -> RunState:
        """The `RunState` to checkpoint at `step`: the driver's progress and this run's identity."""
        return RunState(step, scheduler_state, eval_first, self.reward.run_id, self.reward.attempt, ledger_bytes)

    async def save_checkpoint(self, state: RunState) -> None:
        """The trainer's checkpoint with `state` in it; in a thread, so rollout callbacks keep running."""
        await asyncio.to_thread(self.trainer.save_checkpoint, state.to_checkpoint())

    # --- supervised warm start on expert demonstrations ----------------------------------------------
    def warm_start(self, on_step: Callable[[int, int, dict[str, float]], None]) -> None:
        """`train.warm_start.steps` supervised steps on demonstrations, the trained domains in turn."""
        steps = self.cfg.train.warm_start.steps
        for step, samples in enumerate(demonstration_batches(self.cfg, self.model_path)):
            on_step(step, steps, self.trainer.sft_step(samples))

    # --- validation -----------------------------------------------------------------------------------
    async def evaluate(self, tag: str) -> Evaluation:
        """Scores per domain on its validation split, at the served weights.

        An episode's score is its reward clipped to [0, 1]: format penalties shape training but are not a
        negative score. An episode that fails for an infrastructure reason (it ended FAILED or ABORTED, its
        env worker died, its reward could not be computed) runs again, with the same seed, up to
        `eval.retries` times; one that still fails is counted as failed and left out of the mean. Greedy
        unless `eval.temperature` > 0."""
        n, retries = self.cfg.eval.episodes_per_domain, self.cfg.eval.retries
        scorer = self.reward.for_run(new_run_id())  # an evaluation is a run of its own (reward keys)
        tasks = [
            Task(f"eval/{tag}/{domain}/{i}", domain, domain_cfg.env, seed=i, group_id=f"eval/{tag}/{domain}",
                 split="val")
            for domain, domain_cfg in sorted(self.cfg.domains.items())
            for i in range(n)
        ]

        async def one(task: Task) -> tuple[str, float | None]:
            why = ""
            for attempt in range(retries + 1):
                # a fresh id per try: the proxy remembers aborted ids, a worker refuses a running one
                run = task if attempt == 0 else replace(task, trajectory_id=f"{task.trajectory_id}~{attempt}")
                try:
                    traj = await self.env_router.run(run, self.served_version)
                except Exception as exc:  # noqa: BLE001 — its env worker died: run it again
                    why = f"{type(exc).__name__}: {exc}"
                    continue
                if traj.status is None or not traj.status.trainable:
                    why = f"{traj.status.value if traj.status else 'unfinished'}: {traj.status_reason}"
                    continue
                result = await scorer.score(traj)
                if result.ok:
                    return task.domain, min(max(result.reward, 0.0), 1.0)
                why = f"reward: {result.error}"
            log.warning("evaluation episode %s failed %d time(s), not scored (last: %s)", task.trajectory_id,
                        retries + 1, why)
            return task.domain, None

        max_turns = max(domain_cfg.max_turns for domain_cfg in self.cfg.domains.values())
        timeout = self.cfg.inference.request_timeout_s * max_turns * (retries + 1)
        results = await _bounded(asyncio.gather(*(one(t) for t in tasks)), timeout, "evaluation")
        scores: dict[str, list[float]] = {domain: [] for domain in sorted(self.cfg.domains)}
        failed = dict.fromkeys(scores, 0)
        for domain, score in results:
            if score is None:
                failed[domain] += 1
            else:
                scores[domain].append(score)
        return Evaluation({d: sum(v) / len(v) for d, v in scores.items() if v},
                          {d: len(v) for d, v in scores.items()}, failed)

    async def close(self) -> None:
        if self.scheduler:
            try:
                await _bounded(self.scheduler.stop(), 120, "stopping the rollout scheduler")
            except Exception as exc:  # keep closing the rest
                log.warning("stopping the scheduler: %s", exc)
        self._stack.close()


def demonstration_batches(cfg: RunConfig, model_path: str | Path) -> Iterator[list[Any]]:
    """The warm start's batches: `train.warm_start.steps` batches of `batch_size` expert demonstrations, the
    trained domains in turn (agent domains only when they name `demonstrations`: laid out by the gateway's
    own session code, so with the tokenizer at `model_path`), seeded by `cfg.seed` (the same
    demonstrations in every process)."""
    ws = cfg.train.warm_start
    domains = sorted(d for d, c in cfg.domains.items() if c.weight > 0 and (not c.agent or c.demonstrations))
    if not domains or not ws.steps:
        return
    chat = ChatTokens(load_tokenizer(model_path)) if any(cfg.domains[d].agent for d in domains) else None
    picks = [domains[i % len(domains)] for i in range(ws.batch_size)]
    rng = random.Random(cfg.seed)

    def sample(domain: str) -> Any:
        domain_cfg, seed = cfg.domains[domain], rng.randrange(10**9)
        if domain_cfg.agent:
            return demonstrate_agent(domain, domain_cfg, chat, seed, ws.expert_prob, cfg.envs.gateway.model_name)  # type: ignore[arg-type]
        return list(demonstrate(domain, domain_cfg, seed, "train", ws.expert_prob).messages)

    for _ in range(ws.steps):
        yield [sample(d) for d in picks]


def build_system(cfg: RunConfig, runtime: Runtime, *, with_trainer: bool = True) -> System:
    """Place and connect every plane (`with_trainer=False`: no trainer or weight store — for evaluating
    `model.path`). On any failure, what was started is stopped before re-raising."""
    res = runtime.resources
    stack = ExitStack()
    try:
        model_path = resolve_model_path(cfg.model, cfg.seed)
        store = trainer = None
        if with_trainer:
            store = WeightStore(cfg.weights)
            stack.callback(store.close)
            checkpoint = latest_checkpoint(cfg.run_dir) if cfg.resume else None
            if cfg.resume and checkpoint is None:
                log.warning("resume=true but %s/checkpoints holds no checkpoint: starting fresh", cfg.run_dir)
            trainer = TrainerGroup(cfg, res, PolicyObjective.from_config(cfg.train), store.publisher(),
                                   checkpoint=checkpoint)
            stack.callback(trainer.close)
        inference = {}
        # every domain's pool, weight 0 included: such a domain is still evaluated
        for pool in sorted({domain_cfg.pool for domain_cfg in cfg.domains.values()}):
            inference[pool] = res.place(
                InferenceWorker, pool=pool, replicas=cfg.inference.replicas_per_pool, args=(cfg,),
                num_gpus=gpus_per_worker(cfg, pool),
                kwargs={"subscriber": store.subscriber() if store else None},
                worker_kwargs=lambda p: {"pool": p.pool, "index": p.index},
            )
            stack.callback(inference[pool].shutdown)
        domain_pools = {domain: domain_cfg.pool for domain, domain_cfg in cfg.domains.items()}
        fallbacks = {name: pool.fallback for name, pool in cfg.pools.items()}
        proxy = res.spawn(LLMProxy, {p: list(c.actors) for p, c in inference.items()}, domain_pools,
                          cfg.inference, fallbacks, name="llm_proxy")
        gate = None
        if cfg.rollout.barrier == "turn":
            timeout = cfg.rollout.get_batch_timeout_s
            gate = TurnGateClient(res.spawn(TurnBarrier, timeout, name="turn_barrier"), barrier_timeout_s=timeout)
        env_router = EnvRouter.place(res, cfg, proxy, gate=gate, model_path=model_path)
        stack.callback(env_router.shutdown)
        resumed = RunState.from_checkpoint(trainer.extra_state) if trainer else RunState()
        run_id, attempt = resumed.restart_identity(new_run_id())  # a resume keeps the run id
        log.info("run id %s, attempt %d", run_id, attempt)
        reward = RewardRouter(cfg, run_id=run_id, attempt=attempt).start()
        # an embedded Ray ends with the run, and Serve with it: only the app is deleted (see RewardService.stop)
        stack.callback(reward.stop, shutdown_serve=runtime.mode != "embedded")
        system = System(cfg, res, model_path, store, trainer, inference, proxy, env_router, reward, gate, resumed,
                        _stack=stack)
        system.watch_membership()
        return system
    except BaseException:
        stack.close()
        raise

