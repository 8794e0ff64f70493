"""Builds every plane's objects from a `RunConfig` and wires them together — the RL loop's hands.

In: a validated `RunConfig` and a started `rollart.resources.Runtime`. Out: `build_system(...)` → a
`System` holding the weight store, the trainer ranks, one inference worker set per generation pool behind the
LLM proxy (`inference.proxy_shards` actors, `ProxyShards`), the env router (over the env workers), the reward
router, the run's ledger file and the `RunState` a resumed run continues from. `System` is the real `rollart.loop.LoopSystem`: what the RL loop
(`rollart.loop.RLLoop`) calls for the six steps — `start_rollout`, steps 2–5 (`suspend`, `update_weights`,
`resume`, `recompute_kv`, then `now_serving`), `train_step` (step 6, in a thread so rollout goes on),
`lend_trainer`/`reclaim_trainer` around it (`train.elastic_generation`: `rollart.job.lending`'s `TrainerLoan`),
`evaluate` (`rollart.job.evaluation`), `metrics`, `save_checkpoint`. The warm start before RL is
`rollart.job.warm_start`'s.

Like the rest of `rollart.job` (the composition root: the driver, the checks before a run, the recorder), it
imports several planes; planes meet here through the protocols of `rollart.types`. Every wait is bounded (`_bounded`), and `close()` stops everything `build_system`
started, in reverse order, even after a failure.

Failures: the resource plane keeps the worker sets whole (a dead worker is replaced, an elastic pool grows);
this module passes what it learns on — an inference worker that died leaves the LLM proxy's routing, one
that joined is added to it (the proxy has it pull the served weights first) — and keeps every death, join
and trainer rebuild as an `incident` (a timeline mark the recorder draws on the Gantt charts). What cannot
be recovered stops rollout at once, naming it (the loop's next batch raises): no env worker left and none
can be placed, or a domain with no inference worker on any pool of its chain and none can be placed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, TypeVar

import ray

from rollart.algo import PolicyObjective, algorithm_of, build_train_batch
from rollart.base.background_start import BackgroundStart
from rollart.config import RunConfig
from rollart.control import ActorTurnBarrier, LocalTurnBarrier, RolloutScheduler
from rollart.control.rollout import start_rollout
from rollart.envs.serving.fleet import EnvServerActor
from rollart.envs.router import EnvRouter
from rollart.envs.worker import EnvWorker
from rollart.job.evaluation import announce_episodes, evaluate, validation_rows
from rollart.inference.proxy import LLMProxy
from rollart.inference.proxy_shards import ProxyShards
from rollart.inference.lent_engine import lent_engine_factory
from rollart.inference.worker import InferenceWorker, gpus_per_worker
from rollart.job.lending import LENT_POOL, TrainerLoan
from rollart.models import resolve_model_path
from rollart.loop import DRIVER_LANE, TRAINER_LANE
from rollart.observability.ledger import LedgerFile
from rollart.observability.profile import DomainProfiler
from rollart.observability.timeline import Mark
from rollart.loop.remapping import Remapper
from rollart.resources import WorkerSet, Resources, Runtime
from rollart.resources.affinity import resolve_request
from rollart.resources.errors import PlacementError
from rollart.resources.nodes import loopback_interface
from rollart.resources.worker_set import MemberEvent
from rollart.reward.at_end import EnvSideScorer
from rollart.reward.router import RewardRouter, new_run_id
from rollart.base.run_dir import RunPaths
from rollart.trainer import TrainerRanks, TrainerWorker, latest_checkpoint
from rollart.types import Evaluation, RunState, Span, TimedMetrics, Trajectory
from rollart.weights import WeightStore

log = logging.getLogger("rollart")
T = TypeVar("T")


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
    trainer: TrainerRanks | None
    inference: dict[str, WorkerSet]  # by hardware pool name
    proxy: ProxyShards  # the LLM proxy's actors
    env_router: EnvRouter
    reward: RewardRouter
    turn_barrier: ActorTurnBarrier | None
    # where this start goes on from (a fresh run: step 0), under this start's run id and attempt
    resumed: RunState = field(default_factory=RunState)
    ledger_file: LedgerFile | None = None  # the run's ledger file (None when built for evaluation only)
    validation_rows: dict[str, int] = field(default_factory=dict)  # per dataset domain (evaluation's cap)
    loan: TrainerLoan | None = None  # the trainer's devices lent to generation (train.elastic_generation)
    scheduler: RolloutScheduler | None = None
    inference_version: int = 0
    incidents: list[Mark] = field(default_factory=list)  # deaths, joins, rebuilds (appended from any thread)
    _stack: ExitStack = field(default_factory=ExitStack)
    _loop: asyncio.AbstractEventLoop | None = None  # the driver's, where the scheduler lives
    _recomputed: float = 0.0  # KV tokens the engines recomputed at swaps, up to the last sync
    _recompute_counts: dict[str, float] = field(default_factory=dict)  # per worker, from its last swap's reply
    # what each domain's trained episodes look like lately, and the re-mapping it drives (`rollout.remap`)
    profiler: DomainProfiler = field(default_factory=DomainProfiler)
    remapper: Remapper = field(init=False)

    def __post_init__(self) -> None:
        planned = {domain: domain_cfg.profile for domain, domain_cfg in self.cfg.domains.items()}
        self.remapper = Remapper(self.cfg, self.profiler, planned, reroute=self._reroute)
    _unrecoverable: tuple[BaseException, str] | None = None  # found before rollout started

    # --- keeping the planes in step with the resource plane ---------------------------------------------
    def watch_membership(self) -> None:
        """Follow every worker set's deaths and joins (see the module doc)."""
        for worker_set in self.inference.values():
            worker_set.on_change(self._inference_changed)
        if self.env_router.worker_set is not None:
            self.env_router.worker_set.on_change(self._env_changed)
        if self.trainer is not None:
            self.trainer.on_change(self._record)
            if self.loan is not None:
                self.trainer.on_change(self.loan.on_trainer_change)

    def _inference_changed(self, event: MemberEvent) -> None:
        self._record(event)
        if event.kind == "unplaced":
            alive = {m.placement.pool for worker_set in self.inference.values() for m in worker_set.members()}
            stranded = sorted(d for d, dc in self.cfg.domains.items()
                              if not {dc.pool, *self.cfg.pools[dc.pool].fallback} & alive)
            if stranded:
                self._stop_rollout(RuntimeError(f"no inference worker is left for domains {stranded} (their pools "
                                                f"and fallbacks) and none can be placed: {event.cause}"),
                                   f"inference (worker {event.worker})")
            return
        if event.kind == "died":
            refs = self.proxy.each("remove_worker", event.actor._actor_id.hex(), event.cause)
        else:
            refs = self.proxy.each("add_worker", event.pool, event.actor)
        for ref in refs:
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
        restarts, env resets per domain, the domains' profiles, re-mappings and where each domain's requests
        were generated (and, with proxy shards, through which shard)."""
        proxy = await _bounded(self.proxy.stats(), 30, "LLMProxy.stats")
        resets = await _bounded(self.env_router.reset_metrics(), 60, "EnvRouter.reset_metrics")
        routed = {f"rollout/routed/{domain}/{pool}": float(n)
                  for domain, pools in proxy.get("routed_by_domain", {}).items() for pool, n in pools.items()}
        if len(proxy["routed_by_shard"]) > 1:
            routed.update({f"rollout/routed_by_shard/{i}": float(n) for i, n in enumerate(proxy["routed_by_shard"])})
        return {**(self.scheduler.metrics() if self.scheduler else {}), **self.reward.metrics(), **resets,
                **self.resources.metrics(), "rollout/turn_retries": float(proxy["turn_retries"]),
                **({"train/restarts": float(self.trainer.restarts)} if self.trainer else {}),
                **self.profiler.metrics(), "rollout/remaps": float(len(self.remapper.remaps)), **routed,
                **(self.loan.metrics() if self.loan else {})}

    # --- what the RL loop calls (rollart.loop.LoopSystem) -------------------------------------------
    def start_rollout(self, batches: int) -> RolloutScheduler:
        """Create and start the control plane: batches from the trainer's current version on, the groups a
        resumed run had scored or running taken up again, every ledger move into the run's ledger file."""
        self.scheduler = start_rollout(
            self.cfg, self.env_router, self.reward, batches=batches, first_version=self.trainer.version,
            inference_version=self.inference_version, turn_barrier=self.turn_barrier, resume_from=self.resumed.scheduler,
            ledger_sink=self.ledger_file, group_filter=algorithm_of(self.cfg.train).filter_for(self.cfg.train),
        )
        self._loop = asyncio.get_running_loop()
        if self._unrecoverable is not None:
            self.scheduler.fail(*self._unrecoverable)
        return self.scheduler

    # steps 2–5: suspend, update, resume, recompute (each engine re-prefills at its own swap)
    async def suspend(self) -> None:
        await _bounded(self.proxy.suspend(), self.cfg.inference.request_timeout_s, "LLMProxy.suspend")

    async def update_weights(self, version: int) -> dict[str, float]:
        timings = await _bounded(self.proxy.update_weights(version), self.cfg.inference.request_timeout_s,
                                 f"update of the inference workers to version {version}")
        self._recompute_counts.update({w: t["recompute_tokens"] for w, t in timings.items() if "recompute_tokens" in t})
        return {"time/weights.pull": max((t.get("pull_s", 0.0) for t in timings.values()), default=0.0)}

    async def resume(self) -> None:
        await _bounded(self.proxy.resume(), self.cfg.inference.request_timeout_s, "LLMProxy.resume")

    async def recompute_kv(self) -> dict[str, float]:
        """What the engines recomputed at their swaps since the last sync (an engine counts it when the
        re-prefill runs, its first step after the swap, so a sync reports the earlier syncs' recompute). The
        counters come with the swaps' replies (`update_weights`): no call to the engines here, on the path
        from a train step's end to the next batch's admission."""
        total = sum(self._recompute_counts.values())
        recomputed, self._recomputed = total - self._recomputed, total
        return {"weights/recompute_tokens": max(recomputed, 0.0)}  # (a replaced worker starts from 0)

    async def now_serving(self, version: int) -> None:
        """The rollout starts trajectories under `version`; a domain whose drift is confirmed now is re-mapped
        (a mark on the timeline, `rollout/remaps` counts them)."""
        self.inference_version = version
        if self.scheduler:
            self.scheduler.set_inference_version(version)
        remap = await self.remapper.at_sync(version)
        if remap is not None:
            moves = ", ".join(f"{d} → {p}" for d, p in remap["moved"].items()) or "no move"
            self.incidents.append(Mark("remap" if remap["applied"] else "remap proposed", time.time(), DRIVER_LANE,
                                       f"drift {remap['drift']}: {moves}"))

    async def _reroute(self, moved: dict[str, str]) -> None:
        await _bounded(self.proxy.remap(moved), 30, "LLMProxy.remap")

    # --- the trainer's devices between train steps -----------------------------------------------------
    async def lend_trainer(self) -> None:
        """With `train.elastic_generation`, the trainer's ranks generate on their own weights until reclaimed
        (`rollart.job.lending`); returns at once."""
        if self.loan is not None:
            self.loan.lend()

    async def reclaim_trainer(self) -> TimedMetrics:
        return await self.loan.reclaim() if self.loan is not None else TimedMetrics({})

    # --- step 6: one train step, while rollout goes on ------------------------------------------------
    async def train_step(self, batch: list[Trajectory], version: int) -> TimedMetrics:
        """One optimizer step of the trainer on these trajectories, at policy `version` (it publishes
        version + 1); in a thread, so the event loop (and with it the rollout) goes on."""
        for trajectory in batch:  # (before the first await: the step record taken next sees them)
            self.profiler.observe_trajectory(trajectory)
        train_batch = build_train_batch(batch, version, self.cfg.train,
                                        {d: dc.max_new_tokens for d, dc in self.cfg.domains.items()})
        start = time.time()
        metrics = await asyncio.to_thread(self.trainer.train_step, train_batch)
        return TimedMetrics(metrics, Span("train", start, time.time(), TRAINER_LANE))

    async def save_checkpoint(self, state: RunState) -> None:
        """The trainer's checkpoint with `state` and the rollout's cut in it — its scored groups not trained
        yet and how much of the ledger file it covers, taken with no await in between; in a thread, so
        rollout callbacks keep running while it is written."""
        assert self.scheduler is not None and self.ledger_file is not None
        cut = replace(state, scheduler=self.scheduler.state_dict(), ledger_bytes=self.ledger_file.size())
        await asyncio.to_thread(self.trainer.save_checkpoint, cut.step, cut.to_checkpoint())

    async def evaluate(self, tag: str) -> Evaluation:
        """Scores per domain on its validation split, at the served weights (`rollart.job.evaluation`); an
        evaluation is a run of its own for the reward's idempotency keys."""
        return await evaluate(self.cfg, self.env_router, self.reward.for_run(new_run_id()), self.inference_version,
                              tag, self.validation_rows)

    async def close(self) -> None:
        if self.scheduler:
            try:
                await _bounded(self.scheduler.stop(), 120, "stopping the rollout scheduler")
            except Exception as exc:  # keep closing the rest
                log.warning("stopping the scheduler: %s", exc)
        self._stack.close()


def build_system(cfg: RunConfig, runtime: Runtime, *, with_trainer: bool = True) -> System:
    """Place and connect every plane (`with_trainer=False`: no trainer or weight store — for evaluating
    `model.path`). Two chains start side by side: the rollout side (inference engines, the LLM proxy, env
    workers) on a background thread, the trainer and then the reward service here — the rollout side only
    after the trainer when they share a pool (`trainer_pools_apart`). On any failure, what was started is
    stopped before re-raising."""
    res = runtime.resources
    stack = ExitStack()
    rollout_side = None
    try:
        model_path = resolve_model_path(cfg.model, cfg.seed)
        store = trainer = None
        if with_trainer:
            store = WeightStore(cfg.weights)
            stack.callback(store.close)
            if cfg.weights.transport == "collective":
                _weight_group(cfg, store)
        subscriber = store.subscriber() if store else None

        def start_rollout_side() -> BackgroundStart:
            return BackgroundStart("placing the inference engines, the LLM proxy and the env workers",
                                   lambda side: _start_rollout_side(cfg, res, subscriber, model_path, side))

        apart = not with_trainer or trainer_pools_apart(cfg)
        if apart:  # else after the trainer: whoever is placed first gets a shared pool, as one after another
            rollout_side = start_rollout_side()
        if with_trainer:
            assert store is not None
            checkpoint = latest_checkpoint(cfg.run_dir) if cfg.resume else None
            if cfg.resume and checkpoint is None:
                log.warning("resume=true but %s/checkpoints holds no checkpoint: starting fresh", cfg.run_dir)
            trainer = TrainerRanks(cfg, res, PolicyObjective.of(cfg), store.publisher(), checkpoint=checkpoint,
                                   lent_engine=lent_engine_factory(cfg) if cfg.train.elastic_generation else None)
            stack.callback(trainer.close)
        if not apart:
            rollout_side = start_rollout_side()
        resumed = RunState.from_checkpoint(trainer.extra_state) if trainer else RunState()
        run_id, attempt = resumed.restart_identity(new_run_id())  # a resume keeps the run id
        resumed = replace(resumed, run_id=run_id, attempt=attempt)
        ledger_file = None
        if with_trainer:  # a resumed run first cuts the ledger file back to what its checkpoint covered
            ledger_file = LedgerFile(RunPaths.of(cfg.run_dir), resumed.ledger_bytes)
            stack.callback(ledger_file.close)  # (after everything that could still write to it has stopped)
        log.info("run id %s, attempt %d", resumed.run_id, resumed.attempt)
        reward = RewardRouter(cfg, run_id=resumed.run_id, attempt=resumed.attempt).start()
        # an embedded Ray ends with the run, and Serve with it (see RewardService.stop)
        stack.callback(reward.stop, ray_ends_next=runtime.mode == "embedded")
        # its own waits are bounded: three placements' start-up, each with its placement and start timeouts
        bound = 3 * (cfg.cluster.placement_timeout_s + cfg.cluster.start_timeout_s)
        assert rollout_side is not None
        inference, proxy, env_router, turn_barrier = rollout_side.join(into=stack, timeout_s=bound)
        rows = validation_rows(cfg, model_path)
        announce_episodes(cfg, rows)
        loan = None
        if trainer is not None and cfg.train.elastic_generation:
            loan = TrainerLoan(trainer, proxy, cfg.inference.request_timeout_s)
            loan.register()
        system = System(cfg, res, model_path, store, trainer, inference, proxy, env_router, reward, turn_barrier, resumed,
                        ledger_file, rows, loan=loan, _stack=stack)
        system.watch_membership()
        return system
    except BaseException:
        if rollout_side is not None:
            rollout_side.abandon()
        stack.close()
        raise


def _weight_group(cfg: RunConfig, store: WeightStore) -> None:
    """`weights.transport=collective`: the weight group of the trainer ranks and every inference worker this
    run starts with, meeting at a store the driver serves — on loopback when Ray runs embedded."""
    receivers = sum(cfg.inference.replicas_of(pool) for pool in {d.pool for d in cfg.domains.values()})
    if cfg.cluster.address:
        store.collective(cfg.train.workers, receivers, host=ray.util.get_node_ip_address())
    else:
        store.collective(cfg.train.workers, receivers, host="127.0.0.1", interface=loopback_interface() or "")


def trainer_pools_apart(cfg: RunConfig) -> bool:
    """Whether no pool the trainer's ranks may be placed on (its pool and fallbacks) is one a rollout worker may
    be placed on: then starting both side by side places every worker where one after the other would."""
    def chain(cls: type, pool: str | None = None) -> set[str]:
        return set(resolve_request(cls, cfg.pools, cfg.roles, pool=pool, replicas=1).chain)

    try:
        rollout = chain(EnvWorker)
        for domain_cfg in cfg.domains.values():
            rollout |= chain(InferenceWorker, domain_cfg.pool)
            if domain_cfg.env_servers:
                rollout |= chain(EnvServerActor)
        return not chain(TrainerWorker) & rollout
    except PlacementError:  # one after the other, where the placement itself says what is wrong
        return False


def _start_rollout_side(cfg: RunConfig, res: Resources, subscriber: Any, model_path: Path,
                        stack: ExitStack) -> tuple[dict[str, WorkerSet], ProxyShards, EnvRouter, ActorTurnBarrier | None]:
    """The inference worker sets of every domain's pool (weight-0 domains included: they are still evaluated),
    the LLM proxy's shards over them (each sees every engine: `ProxyShards`), the turn barrier if any, and the
    env router over the env workers."""
    inference = {}
    for pool in sorted({domain_cfg.pool for domain_cfg in cfg.domains.values()}):
        inference[pool] = res.place(
            InferenceWorker, pool=pool, replicas=cfg.inference.replicas_of(pool), args=(cfg,),
            num_gpus=gpus_per_worker(cfg, pool), kwargs={"subscriber": subscriber},
            worker_kwargs=lambda p: {"pool": p.pool, "index": p.index},
        )
        stack.callback(inference[pool].shutdown)
    domain_pools = {domain: domain_cfg.pool for domain, domain_cfg in cfg.domains.items()}
    fallbacks = {name: pool.fallback for name, pool in cfg.pools.items()}
    lendable = (LENT_POOL,) if cfg.train.elastic_generation else ()  # (the trainer's ranks join it once placed)
    proxy = ProxyShards([res.spawn(LLMProxy, {p: list(c.actors) for p, c in inference.items()}, domain_pools,
                                   cfg.inference, fallbacks, lendable, name=f"llm_proxy[{shard}]")
                         for shard in range(cfg.inference.proxy_shards)])
    turn_barrier = None
    if cfg.rollout.barrier == "turn":
        timeout = cfg.rollout.get_batch_timeout_s
        turn_barrier = ActorTurnBarrier(res.spawn(LocalTurnBarrier, timeout, name="turn_barrier"),
                                        barrier_timeout_s=timeout)
    env_router = EnvRouter.place(res, cfg, proxy.clients, turn_barrier=turn_barrier, model_path=model_path,
                                 end_scorer=EnvSideScorer(cfg))
    stack.callback(env_router.shutdown)
    return inference, proxy, env_router, turn_barrier
