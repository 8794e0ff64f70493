"""Builds every plane's objects from a `RunConfig` and wires them together — the driver's hands.

In: a validated `RunConfig` and a started `rollart.resources.Runtime`. Out: a `System` holding the weight
store, the trainer group, one inference cluster per generation pool behind the LLM proxy, the env worker
pool, the reward router and the control plane; plus the few operations the driver's loop is made of:
`sync_weights` (steps 2–5), `train` (step 6, in a thread so rollout goes on), `evaluate`, `warm_start`.

Only this module (with `driver.py`) imports more than one plane; planes meet here through the protocols of
`rollart.types`. Every wait is bounded (`_bounded`), and `close()` stops everything `build_system`
started, in reverse order, even after a failure.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from rollart.algo import PolicyObjective, build_train_batch
from rollart.config import RunConfig
from rollart.control import (
    RolloutScheduler,
    SampleBuffer,
    StalenessPolicy,
    TurnBarrier,
    TurnGateClient,
)
from rollart.envs.expert import demonstrate
from rollart.envs.pool import EnvPool
from rollart.inference.proxy import LLMProxy, LLMProxyClient
from rollart.inference.worker import InferenceWorker, gpus_per_worker
from rollart.models import resolve_model_path
from rollart.resources import Cluster, Resources, Runtime
from rollart.reward.router import RewardRouter
from rollart.trainer import TrainerGroup, latest_checkpoint
from rollart.types import Task, Trajectory
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
    trainer: TrainerGroup | None
    inference: dict[str, Cluster]
    proxy: Any  # LLMProxy actor handle
    envs: EnvPool
    reward: RewardRouter
    gate: TurnGateClient | None
    scheduler: RolloutScheduler | None = None
    served_version: int = 0
    _stack: ExitStack = field(default_factory=ExitStack)

    @property
    def resume_step(self) -> int:
        return int(self.trainer.extra_state.get("step", 0)) if self.trainer else 0

    def start_rollout(self, steps_left: int) -> RolloutScheduler:
        """Create and start the control plane: batches from the trainer's current version on."""
        cfg = self.cfg
        policy = StalenessPolicy(cfg.rollout.alpha, cfg.rollout.staleness)
        weights = {d: dc.weight for d, dc in cfg.domains.items() if dc.weight > 0}
        buffer = SampleBuffer(policy, cfg.rollout.redundancy.selection, weights)
        self.scheduler = RolloutScheduler(
            cfg.rollout, cfg.domains, self.envs, self.reward, buffer, policy, total_batches=steps_left,
            first_version=self.trainer.version, seed=cfg.seed, gate=self.gate,
            trajectory_timeout_s=max(d.max_turns for d in cfg.domains.values())
            * (cfg.inference.request_timeout_s + cfg.envs.step_timeout_s),
        )
        self.scheduler.set_inference_version(self.served_version)
        if "scheduler" in self.trainer.extra_state:
            self.scheduler.load_state_dict(self.trainer.extra_state["scheduler"])
        self.scheduler.start()
        return self.scheduler

    # --- steps 2–5: suspend, update, resume (in-flight requests are re-prefilled by the engines) ------
    async def sync_weights(self, version: int) -> dict[str, float]:
        if version <= self.served_version:
            return {}
        timeout = self.cfg.inference.request_timeout_s
        start = time.perf_counter()
        await _bounded(self.proxy.suspend.remote(), timeout, "LLMProxy.suspend")
        try:
            timings = await _bounded(self.proxy.update_weights_to.remote(version), timeout,
                                     f"update of the inference workers to version {version}")
        finally:
            await _bounded(self.proxy.resume.remote(), timeout, "LLMProxy.resume")
        exposed = time.perf_counter() - start
        span = (time.time() - exposed, time.time())
        self.served_version = version
        if self.scheduler:
            self.scheduler.set_inference_version(version)
        pulls = [t.get("pull_s", 0.0) for t in timings.values()]
        return {"time/weights.exposed": exposed, "time/weights.pull": max(pulls, default=0.0), "_span": span}

    # --- step 6: train while rollout goes on ----------------------------------------------------------
    async def train(self, trajectories: list[Trajectory], version: int) -> dict[str, float]:
        batch = build_train_batch(trajectories, version, self.cfg.train)
        start = time.time()
        metrics = await asyncio.to_thread(self.trainer.train_step, batch)
        return {**metrics, "_span": (start, time.time())}

    # --- supervised warm start on expert demonstrations ----------------------------------------------
    def warm_start(self, on_step: Callable[[int, int, dict[str, float]], None]) -> None:
        """`train.warm_start.steps` supervised steps on demonstrations, the trained domains in turn."""
        ws = self.cfg.train.warm_start
        domains = sorted(d for d, c in self.cfg.domains.items() if c.weight > 0)
        picks = [domains[i % len(domains)] for i in range(ws.batch_size)]
        rng = random.Random(self.cfg.seed)
        for step in range(ws.steps):
            demos = [demonstrate(d, self.cfg.domains[d], rng.randrange(10**9), "train", ws.expert_prob) for d in picks]
            on_step(step, ws.steps, self.trainer.sft_step([list(d.messages) for d in demos]))

    # --- validation -----------------------------------------------------------------------------------
    async def evaluate(self, tag: str) -> dict[str, float]:
        """Mean score per domain on its validation split, at the served weights.

        An episode's score is its reward clipped to [0, 1]: format penalties shape training but are not a
        negative score, and a failed episode scores 0. Greedy unless `eval.temperature` > 0."""
        n = self.cfg.eval.episodes_per_domain
        tasks = [
            Task(f"eval/{tag}/{d}/{i}", d, dc.env, seed=i, group_id=f"eval/{tag}/{d}", split="val")
            for d, dc in sorted(self.cfg.domains.items())
            for i in range(n)
        ]

        async def one(task: Task) -> tuple[str, float]:
            traj = await self.envs.run(task, self.served_version)
            if traj.status is None or not traj.status.trainable:
                return task.domain, 0.0
            result = await self.reward.score(traj)
            return task.domain, min(max(result.reward, 0.0), 1.0) if result.ok else 0.0

        timeout = self.cfg.inference.request_timeout_s * max(dc.max_turns for dc in self.cfg.domains.values())
        results = await _bounded(asyncio.gather(*(one(t) for t in tasks)), timeout, "evaluation")
        scores: dict[str, list[float]] = {}
        for domain, score in results:
            scores.setdefault(domain, []).append(score)
        return {d: sum(v) / len(v) for d, v in scores.items()}

    async def close(self) -> None:
        if self.scheduler:
            try:
                await _bounded(self.scheduler.stop(), 120, "stopping the rollout scheduler")
            except Exception as exc:  # keep closing the rest
                log.warning("stopping the scheduler: %s", exc)
        self._stack.close()


def build_system(cfg: RunConfig, runtime: Runtime, *, train: bool = True) -> System:
    """Place and connect every plane (`train=False`: no trainer or weight store — for evaluating
    `model.path`). On any failure, what was started is stopped before re-raising."""
    res = runtime.resources
    stack = ExitStack()
    try:
        model_path = resolve_model_path(cfg.model, cfg.seed)
        store = trainer = None
        if train:
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
        for pool in sorted({d.pool for d in cfg.domains.values()}):
            inference[pool] = res.place(
                InferenceWorker, pool=pool, replicas=cfg.inference.replicas_per_pool, args=(cfg,),
                num_gpus=gpus_per_worker(cfg, pool),
                kwargs={"subscriber": store.subscriber() if store else None},
                worker_kwargs=lambda p: {"pool": p.pool, "index": p.index},
            )
            stack.callback(inference[pool].shutdown)
        domain_pools = {d: dc.pool for d, dc in cfg.domains.items()}
        proxy = res.spawn(LLMProxy, {p: list(c.actors) for p, c in inference.items()}, domain_pools,
                          cfg.inference, name="llm_proxy")
        gate = None
        if cfg.rollout.barrier == "turn":
            timeout = cfg.rollout.get_batch_timeout_s
            gate = TurnGateClient(res.spawn(TurnBarrier, timeout, name="turn_barrier"), barrier_timeout_s=timeout)
        envs = EnvPool.place(res, cfg, LLMProxyClient(proxy), gate=gate, model_path=model_path)
        stack.callback(envs.shutdown)
        reward = RewardRouter(cfg).start()
        stack.callback(reward.stop)
        return System(cfg, res, model_path, store, trainer, inference, proxy, envs, reward, gate, _stack=stack)
    except BaseException:
        stack.close()
        raise

