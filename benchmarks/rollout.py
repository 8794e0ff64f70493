"""`rollart bench rollout`: trajectory-level rollout vs a turn barrier, under env-step latency N(μ, σ).

The paper's observation 2 (§3.1): environment latency is trajectory-local, but a turn barrier makes every
trajectory wait for the slowest at every turn. Here the same tasks (FrozenLake, 8 turns, the tiny model)
roll out on the real system — env workers, LLM proxy, inference engine, reward, scheduler — once with
`rollout.barrier=none` (each trajectory advances on its own) and once with `barrier=turn`, with env step
latency gaussian(μ = 1 s, σ) injected by the env plane, σ/μ ∈ {0.1, 0.5, 1.0}. Reported per σ:
`traj_vs_turn_barrier_sigma_<σ/μ>` = rollout time per batch with the barrier ÷ without it (the paper:
1.23× at σ/μ = 0.1, 2.27× at 1.0), at two scales — 16 trajectories × 8 turns and 64 × 16 — since the
barrier's cost is the slowest of B trajectories at each of T turns: ≈ T(μ + c_B·σ) against
≈ T·μ + c_B·σ·√T without it (c_B ≈ 1.8 for B = 16, 2.4 for B = 64). Both modes run in one process on one
warm system, alternating, so machine noise hits them alike. `--quick`: μ = 0.1 s, 16 × 4, one batch.
"""

from __future__ import annotations

import asyncio
import tempfile

from benchmarks.common import BenchResult
from rollart.config import RunConfig
from rollart.config.loader import load_config
from rollart.control.rollout import start_rollout
from rollart.resources import Runtime
from rollart.job.system import System, build_system

SIGMAS = (0.1, 0.5, 1.0)


def domain_name(rel: float) -> str:
    return f"lake_sigma{round(rel * 10):02d}"  # no dots: domain names are config key paths


def bench_config(mean_s: float, turns: int, batch: int, run_dir: str) -> RunConfig:
    overrides = [
        f"run_dir={run_dir}", "rollout.barrier=turn", "rollout.alpha=0", f"rollout.batch_size={batch}",
        "rollout.group_size=4", "domains.math=null", "domains.frozenlake=null", "observability.progress=quiet",
        "envs.step_timeout_s=60",
    ]
    for rel in SIGMAS:
        d = f"domains.{domain_name(rel)}"
        overrides += [
            f"{d}.env=frozenlake", f"{d}.pool=gen_prefill", f"{d}.max_turns={turns}", f"{d}.max_new_tokens=8",
            f"{d}.inject.step_latency.dist=gaussian", f"{d}.inject.step_latency.mean_s={mean_s}",
            f"{d}.inject.step_latency.std_s={rel * mean_s}", f"{d}.inject.seed=7",
            # never end early on a malformed action: every episode runs all its turns
            f"{d}.end_on_format_error=false",
        ]
    return load_config(None, overrides)


async def rollout_seconds(system: System, domain: str, barrier: bool, batches: int) -> list[float]:
    """Seconds to fill each of `batches` batches of `domain` (α = 0: one cohort at a time). `system` is the
    real one or the twin's `SimSystem` (which has the same `cfg`, `env_router`, `reward` and `turn_barrier`)."""
    cfg = system.cfg
    one_domain = cfg.model_copy(update={"domains": {domain: cfg.domains[domain]}})
    clock = asyncio.get_running_loop().time  # monotonic on a real loop, virtual in the twin (rollart.sim)
    sched = start_rollout(one_domain, system.env_router, system.reward, batches=batches,
                          turn_barrier=system.turn_barrier if barrier else None, clock=clock)
    times = []
    try:
        for k in range(batches):
            start = clock()
            await sched.get_batch(k)
            times.append(clock() - start)
            sched.set_inference_version(k + 1)  # admit the next cohort (no training in this benchmark)
    finally:
        await sched.stop()
    return times


def run(quick: bool) -> BenchResult:
    # (batch, turns): the barrier's cost grows with both (the slowest of B at each of T turns), so the full
    # run measures two scales; the required ratio names report the larger, `_b<B>_t<T>` names each.
    mean_s, batches, scales = (0.1, 1, [(16, 4)]) if quick else (1.0, 2, [(16, 8), (64, 16)])
    rows: list[dict] = []
    for batch, turns in scales:
        with tempfile.TemporaryDirectory(prefix="rollart-bench-rollout-") as run_dir:
            cfg = bench_config(mean_s, turns, batch, run_dir)
            with Runtime(cfg) as runtime:
                system = build_system(cfg, runtime, with_trainer=False)
                try:
                    rows += [{"batch": batch, "turns": turns, **r} for r in asyncio.run(_measure(system, batches))]
                finally:
                    asyncio.run(system.close())
    ratios = {}
    for batch, turns in scales:
        for rel in SIGMAS:
            by = {r["barrier"]: r["s_per_batch"] for r in rows
                  if r["sigma_over_mu"] == rel and (r["batch"], r["turns"]) == (batch, turns)}
            ratios[f"traj_vs_turn_barrier_sigma_{rel}_b{batch}_t{turns}"] = by["turn"] / by["none"]
    big = scales[-1]
    for rel in SIGMAS:
        ratios[f"traj_vs_turn_barrier_sigma_{rel}"] = ratios[f"traj_vs_turn_barrier_sigma_{rel}_b{big[0]}_t{big[1]}"]
    notes = [f"env step latency gaussian(mean {mean_s}s, std sigma*mean) clipped at 0; groups of 4; {batches} "
             f"batch(es) per arm; generation by the tiny model on the real engine; scales (batch, turns) {scales}"]
    return BenchResult("rollout", ratios, rows, notes)


async def _measure(system: System, batches: int) -> list[dict]:
    rows = []
    for rel in SIGMAS:
        for barrier in (False, True):
            secs = await rollout_seconds(system, domain_name(rel), barrier, batches)
            rows.append({"sigma_over_mu": rel, "barrier": "turn" if barrier else "none",
                         "s_per_batch": round(sum(secs) / len(secs), 3)})
    return rows
