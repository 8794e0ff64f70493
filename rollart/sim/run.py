"""Run the twin: the driver's loop over a `SimSystem`, in virtual time, and what it measured.

In: a `RunConfig` (its `train.steps`, rollout mode and domains with their profiles) and a `SimHardware`.
Out: `SimReport` — per step the virtual step time and its parts (wait for the batch, exposed weight sync,
train step), trajectories and tokens trained, throughput (trajectories per second and per dollar-hour),
utilisation of each pool, the control plane's counters and its ledger/staleness invariants checked, and
what the twin itself cost: wall and CPU seconds, generation turns, CPU µs per turn (the production control
plane's Python per turn plus the twin's cost models: an upper bound of the control plane's own cost) and the
share of one core the process needed per second of the simulated cluster (`control_core_share`: above 1, one
process could not keep up with that cluster in real time).

The loop is the real run's own `rollart.loop.RLLoop` (no copy of it here): the twin hands it a `SimSystem`
(a `LoopSystem`) and a `SimRecorder` (a `LoopRecorder`) that keeps the step records in memory on the
virtual clock.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from rollart.config import DomainProfileConfig, RunConfig
from rollart.control import StalenessPolicy
from rollart.loop import RLLoop
from rollart.sim.clock import run_virtual
from rollart.sim.hardware import SimHardware
from rollart.sim.reward import SimRewardPool
from rollart.sim.system import SimSystem
from rollart.types import Evaluation, TimedMetrics, Trajectory


class SimRecorder:
    """The `rollart.loop.LoopRecorder` of the twin: step records in memory, on the virtual clock, with the
    staleness invariant checked on every trajectory handed to training."""

    def __init__(self, cfg: RunConfig, clock: Any,
                 on_step: Callable[[int, Mapping[str, float]], None] | None = None) -> None:
        """`on_step(step, record)`: told after each step (progress)."""
        self.cfg, self.clock, self.on_step = cfg, clock, on_step
        self.evals: dict[int, dict[str, float]] = {}
        self.steps: list[dict[str, float]] = []
        self.staleness_violations: list[str] = []
        self.sync_exposed_s: list[float] = []  # each weight sync's exposed time, in order
        self._pending: dict[str, float] = {}
        self._step_start = clock()
        self.policy = StalenessPolicy(cfg.rollout.alpha, cfg.rollout.staleness)

    def rl_starts(self) -> None:
        self._step_start = self.clock()  # (the twin's start-up takes no virtual time)

    def wall_s(self) -> float:
        return self.clock()  # virtual seconds since the twin's run began

    def phase(self, phase: TimedMetrics) -> None:
        if "time/weights.exposed" in phase.metrics:
            self.sync_exposed_s.append(float(phase.metrics["time/weights.exposed"]))
        for key, value in phase.metrics.items():
            self._pending[key] = self._pending.get(key, 0.0) + float(value)

    def train_step_done(self, step: int, train_step: TimedMetrics) -> None:
        seconds = float(train_step.metrics.get("time/train_step", 0.0))
        if step < len(self.steps):
            self.steps[step]["train_s"] = seconds
        else:  # landed before its step's record (a batch barrier, or α = 0): it goes into that record
            self._pending["train_s"] = seconds

    def step(self, step: int, batch: Sequence[Trajectory], version: int, metrics: Mapping[str, float]) -> None:
        now = self.clock()
        for t in batch:  # the invariant, checked on every trajectory handed to training
            if not self.policy.is_fresh(t, version):
                self.staleness_violations.append(
                    f"step {step}: {t.trajectory_id} behaviour version {self.policy.behaviour_version(t)} "
                    f"trained at {version} (α={self.policy.alpha})")
        record = {
            "step": float(step), "time": now, "step_s": now - self._step_start,
            "trajectories": float(len(batch)),
            "tokens": float(sum(t.metrics.get("total_tokens", 0.0) for t in batch)),
            "response_tokens": float(sum(t.num_response_tokens for t in batch)),
            "max_staleness": float(max((self.policy.staleness(t, version) for t in batch), default=0)),
            **{k: float(v) for k, v in metrics.items()},
            **self._pending,
        }
        self._pending = {}
        self.steps.append(record)
        self._step_start = now
        if self.on_step is not None:
            self.on_step(step, record)

    def evaluation(self, step: int, evaluation: Evaluation) -> None:
        self.evals[step] = dict(evaluation.scores)


@dataclass
class SimReport:
    steps: list[dict[str, float]]
    virtual_s: float
    wall_s: float
    price_per_hour: float
    pools: dict[str, dict[str, float]]
    reward: dict[str, Any]
    counters: dict[str, float]
    ledger_violations: list[str]
    staleness_violations: list[str]
    sync_exposed_s: list[float]
    trainer_busy_s: float
    cpu_s: float = 0.0  # CPU seconds of this process while the twin ran (every job, when several share the loop)
    trainer_lent_busy_s: float = 0.0  # GPU-seconds the trainer's devices generated while lent (elastic generation)
    trainer_gpus: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> float:
        """Generation turns (requests the engines took), every pool."""
        return sum(p.get("requests", 0.0) for p in self.pools.values())

    def trainer_pool_busy_fraction(self) -> float:
        """Share of the trainer pool's GPU-time spent training or, while lent, generating."""
        total = self.trainer_gpus * self.virtual_s
        return (self.trainer_busy_s * self.trainer_gpus + self.trainer_lent_busy_s) / total if total else 0.0

    def get_batch_idle_share(self, skip: int = 1, upto: int | None = None) -> float:
        """Steady steps' `time/get_batch_idle` (the batch wait with no train step in flight) over their time."""
        rows = self.steps[skip:upto] or self.steps[:upto]
        return sum(r.get("time/get_batch_idle", 0.0) for r in rows) / sum(r["step_s"] for r in rows)

    @property
    def cpu_us_per_turn(self) -> float:
        return self.cpu_s * 1e6 / self.turns if self.turns else 0.0

    @property
    def control_core_share(self) -> float:
        """CPU seconds per simulated second: the share of one core the control plane (with the twin's models)
        needs to keep pace with the simulated cluster."""
        return self.cpu_s / self.virtual_s if self.virtual_s else 0.0

    def mean_step_s(self, skip: int = 1, upto: int | None = None) -> float:
        """Mean step time of steps `skip`..`upto` (the first `skip` left out: the pipeline fills; `upto`
        compares a longer run with a shorter one over the same steps)."""
        times = [s["step_s"] for s in self.steps[skip:upto]] or [s["step_s"] for s in self.steps[:upto]]
        return sum(times) / len(times)

    @property
    def trajectories_per_s(self) -> float:
        done = sum(s["trajectories"] for s in self.steps)
        return done / self.virtual_s if self.virtual_s else 0.0

    def steady_trajectories_per_s(self, skip: int = 1, upto: int | None = None) -> float:
        rows = self.steps[skip:upto] or self.steps[:upto]
        return sum(r["trajectories"] for r in rows) / sum(r["step_s"] for r in rows)

    def per_dollar_hour(self, skip: int = 1) -> float:
        """Trained trajectories per second per dollar-hour of the cluster."""
        return self.steady_trajectories_per_s(skip) / self.price_per_hour

    def summary(self) -> dict[str, Any]:
        return {
            "steps": len(self.steps), "virtual_s": round(self.virtual_s, 3), "wall_s": round(self.wall_s, 3),
            "mean_step_s": round(self.mean_step_s(), 3),
            "trajectories_per_s": round(self.steady_trajectories_per_s(), 4),
            "price_per_hour": round(self.price_per_hour, 2), "turns": self.turns, "cpu_s": round(self.cpu_s, 3),
            "cpu_us_per_turn": round(self.cpu_us_per_turn, 1),
            "ledger_violations": len(self.ledger_violations),
            "staleness_violations": len(self.staleness_violations),
        }


def simulate(cfg: RunConfig, hardware: SimHardware, reward_pool: SimRewardPool | None = None,
             shifts: Mapping[str, tuple[int, DomainProfileConfig]] | None = None, remapper: Any = None,
             on_step: Callable[[int, Mapping[str, float]], None] | None = None) -> SimReport:
    """Run `cfg.train.steps` RL steps of `cfg` on `hardware`, in virtual time (`shifts`: a workload shift,
    {domain: (version, profile)}; `remapper`: what proposes a mapping on drift, see SimSystem; `on_step`:
    told each step's record as it ends)."""
    started = time.perf_counter()
    return run_virtual(simulate_async(cfg, hardware, reward_pool, shifts, started, remapper, on_step))


async def simulate_async(cfg: RunConfig, hardware: SimHardware, reward_pool: SimRewardPool | None = None,
                         shifts: Mapping[str, tuple[int, DomainProfileConfig]] | None = None,
                         started: float | None = None, remapper: Any = None,
                         on_step: Callable[[int, Mapping[str, float]], None] | None = None) -> SimReport:
    """The same, inside a running virtual-time loop (several jobs can share one loop and one reward pool)."""
    started = started if started is not None else time.perf_counter()
    cpu_started = time.process_time()
    system = SimSystem(cfg, hardware, reward_pool, shifts, remapper)
    recorder = SimRecorder(cfg, system.clock, on_step)
    try:
        await RLLoop(cfg, system, recorder, clock=system.clock).run()
    finally:
        await system.close()
    sched = system.scheduler
    assert sched is not None
    now = asyncio.get_running_loop().time()
    return SimReport(
        steps=recorder.steps, virtual_s=now, wall_s=time.perf_counter() - started,
        price_per_hour=hardware.price_per_hour(), pools=system.engine_stats(),
        reward=system.reward_pool.stats(now), counters=sched.metrics(), ledger_violations=sched.check_ledger(),
        staleness_violations=recorder.staleness_violations, sync_exposed_s=recorder.sync_exposed_s,
        trainer_busy_s=system.trainer.busy_s, cpu_s=time.process_time() - cpu_started,
        trainer_lent_busy_s=system.lending.busy_s() if system.lending is not None else 0.0,
        trainer_gpus=system.hardware.pools[system.hardware.train_pool].count,
        extra={"fates": dict(Counter(sched.fate.values())), "remaps": system.remapper.remaps, "profile": system.profiler.metrics(),
               "domain_pools": dict(system.proxy_impl.domain_pools()),
               **({"control": system.control.stats(now)} if system.control is not None else {})},
    )
