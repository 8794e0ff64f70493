"""`SimSystem`: the production control plane wired to simulated workers — what the driver's loop runs on.

In: a validated `RunConfig`, a `SimHardware`, optionally a shared `SimRewardPool` (several jobs, one
service). Out: a `rollart.loop.LoopSystem` — what the RL loop (`rollart.loop.RLLoop`, the real run's own)
calls for its six steps — plus `close()` and what the twin reports (`engine_stats`, `remaps`), built from:

- the production control plane: `RolloutScheduler`, `SampleBuffer`, `StalenessPolicy`, the `LocalTurnBarrier`
  (`rollout.barrier=turn`), with the virtual clock;
- the production `LLMProxy` (suspend/resume, abort, routing by domain → pool, sticky per trajectory) over
  one `SimEngine` per `tp` GPUs of each generation pool, reached through `LocalHandle`s;
- the production reward client (`LocalRewardClient`: tries, timeouts, in-flight limit), each domain scored by
  the `SimRewardPool`'s function (`SimScorer`);
- `SimEnvRunner` (the env plane), `SimTrainer` and the `WeightChannel`;
- with the hardware file's `control` section, the proxy's CPU per turn, sharded (`ShardedProxyCost`);
- with `train.elastic_generation`, engines on the trainer's pool lent to generation between train steps
  (`TrainerLending`, the proxy's lendable pool);
- the online profiler (`DomainProfiler`: `profile/<domain>/*` metrics from every turn) and, with
  `rollout.remap`, the re-mapping of a real run (`rollart.loop.remapping.Remapper`), proposing the analytic
  estimate's best mapping for the simulated hardware (or the re-mapper it is given).

Everything runs in one `VirtualTimeLoop`; nothing here re-implements a decision of the control plane.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Callable, Mapping

from rollart.algo import algorithm_of
from rollart.config import DomainProfileConfig, RunConfig
from rollart.control import LocalTurnBarrier, RolloutScheduler
from rollart.control.rollout import start_rollout
from rollart.inference.proxy import LLMProxy
from rollart.loop import TRAINER_LANE
from rollart.observability.profile import DomainProfiler
from rollart.loop.remapping import Remapper
from rollart.sim.control import ShardedProxyCost
from rollart.sim.costs import EngineCost, TrainerCost, WeightSyncCost
from rollart.sim.elastic import POOL as LENT
from rollart.sim.elastic import TrainerLending
from rollart.sim.engine import LocalHandle, SimEngine
from rollart.sim.estimate import best_mapping
from rollart.sim.envs import SimEnvRunner
from rollart.sim.hardware import SimHardware
from rollart.sim.reward import SimRewardPool, SimScorer
from rollart.sim.trainer import SimTrainer, WeightChannel
from rollart.sim.workload import profile_of
from rollart.types import Evaluation, RunState, Span, TimedMetrics, Trajectory


class SimResources:
    """What the driver reads of the resource plane: pool metrics (the twin places nothing)."""

    def __init__(self, hardware: SimHardware) -> None:
        self.hardware = hardware

    def metrics(self) -> dict[str, float]:
        return {f"pools/{name}/gpus": float(p.count) for name, p in self.hardware.pools.items()}


class SimSystem:
    def __init__(self, cfg: RunConfig, hardware: SimHardware, reward_pool: SimRewardPool | None = None,
                 shifts: Mapping[str, tuple[int, DomainProfileConfig]] | None = None,
                 remapper: Callable[..., tuple[tuple[str, str], ...]] | None = None) -> None:
        self.cfg, self.hardware = cfg, hardware
        self.propose_mapping = remapper  # (cfg, hardware, pools, tp) → mapping; None: the analytic estimate's best
        self.profiler = DomainProfiler()
        # what each domain's mapping was made for: the profile its episodes are drawn from
        self.remapper = Remapper(cfg, self.profiler, {d: profile_of(dc) for d, dc in cfg.domains.items()},
                                 reroute=self._reroute, propose=self._propose)
        self.clock: Callable[[], float] = lambda: asyncio.get_running_loop().time()
        gen_pools = sorted({d.pool for d in cfg.domains.values()})
        for pool in gen_pools + [hardware.train_pool]:
            if pool not in hardware.pools or hardware.pools[pool].count == 0:
                raise ValueError(
                    f"pool {pool!r} (used by the run config) has no GPUs in the hardware file; "
                    f"hardware pools: {sorted(hardware.pools)}"
                )
        engines_total = sum(hardware.pools[p].count // hardware.pools[p].tp for p in gen_pools)
        self.weights = WeightChannel(WeightSyncCost(hardware.model, hardware.link_gbps(), hardware.weights,
                                                    engines_total))
        self.engines: dict[str, list[SimEngine]] = {}
        index = 0
        for pool in gen_pools:
            spec = hardware.pools[pool]
            cost = EngineCost(hardware.model, hardware.gpu_kind(pool), spec.tp, hardware.engine)
            self.engines[pool] = []
            for i in range(spec.count // spec.tp):
                self.engines[pool].append(SimEngine(f"inference/{pool}/{i}", cost, self.weights, index))
                index += 1
        domain_pools = {d: dc.pool for d, dc in cfg.domains.items()}
        train = hardware.pools[hardware.train_pool]
        self.trainer = SimTrainer(TrainerCost(hardware.model, hardware.gpu_kind(hardware.train_pool), train.count,
                                              hardware.trainer), self.weights,
                                  critic=algorithm_of(cfg.train).critic)
        self.lending = (TrainerLending(hardware, self.weights, index, self.trainer, self.clock)
                        if cfg.train.elastic_generation else None)
        workers = {p: [LocalHandle(e) for e in es] for p, es in self.engines.items()}
        if self.lending is not None:
            workers[LENT] = [LocalHandle(e) for e in self.lending.engines]
        self.proxy_impl = LLMProxy(workers, domain_pools, cfg.inference, lendable=[LENT] if self.lending else ())
        if self.lending is not None:
            self.lending.proxy = self.proxy_impl
        self.proxy = LocalHandle(self.proxy_impl)
        self.turn_barrier = LocalTurnBarrier(cfg.rollout.get_batch_timeout_s) if cfg.rollout.barrier == "turn" else None
        # the proxy is in this process: the env runner calls it as its LLMClient (no actor-handle wrapper), through
        # the control plane's CPU model when the hardware file gives one (control.py)
        self.control = (ShardedProxyCost(hardware.control, self.proxy_impl, list(cfg.domains))
                        if hardware.control.us_per_turn > 0 else None)
        self.env_router = SimEnvRunner(cfg.domains, cfg.envs, self.control or self.proxy_impl,
                                       turn_barrier=self.turn_barrier, seed=cfg.seed,
                                       observer=self.profiler, shifts=shifts)
        self.reward_pool = reward_pool or SimRewardPool(hardware.reward)
        self.reward = SimScorer(cfg, self.reward_pool, seed=cfg.seed)
        self.resources = SimResources(hardware)
        self.scheduler: RolloutScheduler | None = None
        self.inference_version = 0
        self.resumed = RunState()  # the twin always starts afresh
        self._recomputed = 0  # KV tokens the engines recomputed at swaps, up to the last sync

    # --- what the RL loop calls (rollart.loop.LoopSystem) -----------------------------------------
    def start_rollout(self, batches: int) -> RolloutScheduler:
        self.scheduler = start_rollout(self.cfg, self.env_router, self.reward, batches=batches,
                                       first_version=self.trainer.version, inference_version=self.inference_version,
                                       turn_barrier=self.turn_barrier, clock=self.clock,
                                       group_filter=algorithm_of(self.cfg.train).filter_for(self.cfg.train))
        return self.scheduler

    # steps 2–5 through the production proxy, in process (virtual time: nothing can hang on a real process,
    # a wait that can never end is a SimulationDeadlock)
    async def suspend(self) -> None:
        await self.proxy.suspend.remote()

    async def update_weights(self, version: int) -> dict[str, float]:
        timings = await self.proxy.update_weights.remote(version)
        return {"time/weights.pull": max((t.get("pull_s", 0.0) for t in timings.values()), default=0.0)}

    async def resume(self) -> None:
        await self.proxy.resume.remote()

    async def recompute_kv(self) -> dict[str, float]:
        """The engines' fluid model recomputes in-flight KV at its swap (`SimEngine.update_weights`);
        what it recomputed since the last sync."""
        total = sum(e.counts["recompute_tokens"] for es in self.engines.values() for e in es)
        recomputed, self._recomputed = total - self._recomputed, total
        return {"weights/recompute_tokens": float(recomputed)}

    async def now_serving(self, version: int) -> None:
        self.inference_version = version
        if self.scheduler:
            self.scheduler.set_inference_version(version)
        await self.remapper.at_sync(version)

    async def _propose(self, measured: Mapping[str, DomainProfileConfig],
                       drifted: Mapping[str, float]) -> dict[str, str]:
        """The mapping the estimate ranks first for the measured profiles on these pools (or the re-mapper's:
        e.g. the planner's twin runs, in a thread, taking no virtual time)."""
        cfg = self.cfg.model_copy(update={"domains": {
            d: dc.model_copy(update={"profile": measured[d]}) for d, dc in self.cfg.domains.items()}})
        pools = tuple((p, self.hardware.pools[p].gpu, self.hardware.pools[p].count) for p in sorted(self.engines))
        tp = self.hardware.pools[pools[0][0]].tp
        if self.propose_mapping is not None:
            return dict(await asyncio.to_thread(self.propose_mapping, cfg, self.hardware, pools, tp))
        return dict(best_mapping(cfg, self.hardware, pools, tp))

    async def _reroute(self, moved: dict[str, str]) -> None:
        await self.proxy.remap.remote(moved)

    async def lend_trainer(self) -> None:
        if self.lending is not None:
            self.lending.lend()

    async def reclaim_trainer(self) -> TimedMetrics:
        if self.lending is None:
            return TimedMetrics({})
        start = self.clock()
        seconds, moved = await self.lending.reclaim()
        if not seconds and not moved:
            return TimedMetrics({})
        return TimedMetrics({"time/trainer.reclaim": seconds, "train/lent_preempted_turns": float(moved)},
                            Span("trainer.reclaim", start, self.clock(), TRAINER_LANE))

    async def train_step(self, batch: list[Trajectory], version: int) -> TimedMetrics:
        start = self.clock()
        metrics = await self.trainer.train_step(batch)
        return TimedMetrics(metrics, Span("train", start, self.clock(), TRAINER_LANE))

    async def save_checkpoint(self, state: RunState) -> None:
        """The twin keeps no weights: the checkpoint is the run state with the rollout's cut."""
        assert self.scheduler is not None
        self.trainer.save_checkpoint(replace(state, scheduler=self.scheduler.state_dict()).to_checkpoint())

    async def metrics(self) -> dict[str, float]:
        """The counters of a step record: rollout and buffer, reward, pools, the domains' profiles."""
        return {**(self.scheduler.metrics() if self.scheduler else {}), **self.reward.metrics(),
                **self.resources.metrics(), **self.profiler.metrics()}

    async def evaluate(self, tag: str) -> Evaluation:
        """The twin does not score a policy: evaluation takes no time and reports nothing."""
        return Evaluation({}, {}, {})

    async def close(self) -> None:
        if self.scheduler:
            await self.scheduler.stop()
        if self.lending is not None:
            await self.lending.reclaim()

    # --- what the twin reports ----------------------------------------------------------------------
    def engine_stats(self) -> dict[str, dict[str, float]]:
        """Per generation pool: GPU-busy share, generation requests (turns) and their context tokens, generated
        tokens, prefix-hit rate."""
        now = self.clock()
        out = {}
        for pool, engines in self.engines.items():
            busy = sum(e.busy_s for e in engines)
            prompt = sum(e.counts["prompt_tokens"] for e in engines)
            prefill = sum(e.counts["prefill_tokens"] for e in engines)
            out[pool] = {
                "engines": float(len(engines)),
                "busy_fraction": busy / (len(engines) * now) if now > 0 else 0.0,
                "requests": float(sum(e.counts["requests"] for e in engines)),
                "prompt_tokens": float(prompt),
                "generated_tokens": float(sum(e.counts["generated"] for e in engines)),
                "prefix_hit_rate": 1 - prefill / prompt if prompt else 0.0,
            }
        return out
