"""`rollart bench reward`: a reserved local reward worker vs the serverless reward service (paper §7).
(`--jobs N`: N concurrent jobs sharing one service, see reward_multijob.py.)

The paper moved a reserved reward model off its GPUs onto an elastic function service and gave those GPUs
to rollout: rollout time 158 s → 77 s (2.05×), reward utilisation 6–7.4% → 88%. Here, on this machine's
cores, the same workload runs twice, back to back, per repetition:

- `local` arm: a reward worker process pinned to the reserved cores (the upper half of this process's
  cores; 1 of 2 here) scores each trajectory as it finishes; rollout runs on the other cores.
- `serverless` arm: rollout runs on every core; each finished trajectory is scored through `RewardRouter`
  on the `serverless` backend — the Ray Serve reward service, autoscaling 0..2 replicas, not pinned (they
  share the cores only while they score). Before the arm the service is at zero replicas; one request
  brings a replica up (its latency is reported as `cold_start_s`, outside the arm's time) — in a training
  run the service stays up across steps, so a step's rollout meets a warm service, as this arm does.

Priority: Ray starts worker processes at nice 15 by default; the bench's embedded Ray starts them at 0
(`RAY_worker_niceness=0`), so reward replicas, the reserved worker and Ray itself all run at nice 0. In the paper the serverless reward runs on capacity of its own, so it never waits behind
generation. On one machine its replicas must share the rollout's cores; so that reward work still runs
the moment it arrives, rollout processes run at nice 10 in the `local` and `serverless` arms (reward
replicas, Ray and the reserved worker at the normal 0): rollout gets every cycle reward does not use. A
third arm, `serverless_equal_priority`, runs the rollout at nice 0 — reward then competes with 4 rollout
processes for 2 cores — and is reported beside it.

Workload (synthetic, stated plainly): generation is a stand-in — rollout processes (2 per core) burn
`gen_ms` of CPU time per turn (`time.thread_time`, so the work per trajectory is fixed whatever else the
machine runs), `turns` turns per trajectory; the real engine is another plane. The reward is a judge-like
stand-in: `judge_stand_in` burns `reward_ms` of CPU then compares the answer (what a small reward model's
forward costs, relative to generation, on this CPU). Every trajectory is scored the moment it finishes.

Figures: `rollout_time_local_vs_serverless` = median local rollout time ÷ median serverless (paper 2.05);
`reward_util_serverless` = reward busy time ÷ replica-seconds of the service during the serverless arm
(paper 0.88); `reward_util_local` = busy time of the reserved worker ÷ the local rollout time (paper
0.06–0.074). Busy time is the time with at least one scoring in progress.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from benchmarks.common import BenchResult
from benchmarks.reward_workload import NICE, burn_cpu, generate, pin, set_niceness, window_max
from rollart.types import Task, Trajectory, Turn

FN_SPEC = "benchmarks.reward:judge_stand_in"


def judge_stand_in(trajectory: Trajectory) -> float:
    """The bench's reward fn (also run inside Serve replicas): `reference['reward_ms']` of CPU, then a
    string comparison of the final action with `reference['answer']`."""
    burn_cpu(float(trajectory.reference.get("reward_ms", 0.0)))
    return 1.0 if trajectory.turns and trajectory.turns[-1].action == trajectory.reference.get("answer") else 0.0


def score_reserved(trajectory: Trajectory) -> tuple[float, float]:
    """The reserved local reward worker (a process pinned to the reserved cores): (reward, busy seconds)."""
    t0 = time.monotonic()
    reward = judge_stand_in(trajectory)
    return reward, time.monotonic() - t0


def make_trajectory(i: int, action: str, reward_ms: float) -> Trajectory:
    return Trajectory(
        f"bench-{time.monotonic_ns()}-{i}", Task(f"t{i}", "bench", "math", i, f"g{i}"), 0,
        (Turn((), (), (), (), action=action),), reference={"answer": f"\\boxed{{{i % 10}}}", "reward_ms": reward_ms},
    )


async def _rollout(n: int, turns: int, gen_ms: float, reward_ms: float, cores: tuple[int, ...],
                   rollout: ProcessPoolExecutor, score: Any) -> tuple[float, list[Any]]:
    """Generate n trajectories on `cores`; score each as soon as it finishes; time until the last score."""
    t0 = time.monotonic()

    async def one(i: int) -> Any:
        action = await asyncio.wrap_future(rollout.submit(generate, i, turns, gen_ms, cores))
        return await score(make_trajectory(i, action, reward_ms))

    results = await asyncio.gather(*(one(i) for i in range(n)))
    return time.monotonic() - t0, list(results)


def _serverless_arm(arm: str, rep: int, service: Any, router: Any, pool: ProcessPoolExecutor, n: int, turns: int,
                    gen_ms: float, reward_ms: float, cores: tuple[int, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while service.replicas.current > 0 and time.monotonic() < deadline:  # from zero replicas …
        time.sleep(0.2)
    t0 = time.monotonic()
    first = asyncio.run(router.score(make_trajectory(-1, "", reward_ms)))  # … one request brings a replica up
    cold_start_s = time.monotonic() - t0
    if not first.ok:
        raise RuntimeError(f"{arm}: the warm-up scoring failed: {first.error}")
    before = service.stats()
    replica_s0, w0 = service.replicas.integral(), time.time()
    t, results = asyncio.run(_rollout(n, turns, gen_ms, reward_ms, cores, pool, router.score))
    after = service.stats()
    replica_s = service.replicas.integral() - replica_s0
    busy = after["busy_s"] - before["busy_s"]
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{arm}: {len(failed)} scorings failed, e.g. {failed[0]}")
    lat = sorted(r.latency_s for r in results)
    return {"arm": arm, "rep": rep, "rollout_s": round(t, 3), "cold_start_s": round(cold_start_s, 3),
            "reward_busy_s": round(busy, 3),
            "reward_util": round(busy / replica_s, 4) if replica_s > 0 else 0.0, "replica_s": round(replica_s, 3),
            "replicas_max": window_max(service.replica_timeline(), w0, time.time()),
            "cold_starts": sum(bool(r.details.get("cold_start")) for r in results),
            "reward_p50_s": round(lat[len(lat) // 2], 4),
            "reward_p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 4),
            "rollout_cores": len(cores), "reward_cores": 0}


def run(quick: bool, jobs: int = 1) -> BenchResult:
    """The single-job comparison below; `jobs` > 1: N jobs on one shared service (reward_multijob.py)."""
    if jobs > 1:
        from benchmarks.reward_multijob import run as run_multijob

        return run_multijob(quick, jobs)
    from rollart.config import DomainConfig, RunConfig
    from rollart.resources import Runtime
    from rollart.reward import RewardRouter
    from rollart.reward.service import RewardService

    n, turns, gen_ms, reward_ms, reps = (24, 2, 40.0, 20.0, 1) if quick else (96, 4, 50.0, 20.0, 2)
    cores = tuple(sorted(os.sched_getaffinity(0)))
    if len(cores) < 2:
        raise RuntimeError(f"the reward bench needs at least 2 cores to reserve one for reward; this process has {cores}")
    reserved = cores[len(cores) // 2 :]
    local_cores = cores[: len(cores) // 2]
    procs = 2 * len(cores)

    # Ray starts its worker processes (the reward replicas among them) at nice 15, where a nice-0 process
    # gets ~28× their CPU share: start this bench's Ray with workers at nice 0, so the priorities below hold
    os.environ["RAY_worker_niceness"] = "0"
    cfg = RunConfig(domains={"bench": DomainConfig(env="math", reward={"fn": FN_SPEC, "backend": "serverless"})})
    cfg.cluster.num_cpus = len(cores)
    sl = cfg.reward.serverless
    sl.min_replicas, sl.max_replicas, sl.downscale_delay_s, sl.target_ongoing_requests = 0, 2, 3.0, 2.0
    rows: list[dict[str, Any]] = []
    notes = [
        f"cores {list(cores)}: local arm = rollout on {list(local_cores)}, reward worker pinned to {list(reserved)}; "
        f"serverless arm = rollout on {list(cores)}, Ray Serve replicas (0..{sl.max_replicas}, unpinned)",
        f"workload: {n} trajectories × {turns} turns × {gen_ms:g} ms CPU of synthetic generation in {procs} "
        f"rollout processes; reward = {reward_ms:g} ms CPU judge stand-in per trajectory, scored on finish",
        f"rollout at nice {NICE} in the local and serverless arms (reward at 0), nice 0 in serverless_equal_priority",
        f"load average at start: {os.getloadavg()[0]:.2f} (the machine is shared; ratios are side by side)",
    ]
    with Runtime(cfg) as _rt, ProcessPoolExecutor(procs, initializer=set_niceness, initargs=(NICE,)) as rollout, \
            ProcessPoolExecutor(procs, initializer=set_niceness, initargs=(0,)) as rollout_equal, \
            ProcessPoolExecutor(1, initializer=pin, initargs=(reserved,)) as reward_worker:
        for pool in (rollout, rollout_equal):  # start the processes before timing anything
            list(pool.map(generate, range(procs), [0] * procs, [0.0] * procs, [cores] * procs))
        reward_worker.submit(score_reserved, make_trajectory(0, "", 0.0)).result()
        service = RewardService(cfg, poll_s=0.1)  # replicas sampled every 0.1 s: the utilisation's denominator
        service.start()
        router = RewardRouter(cfg, service=service)
        try:
            for rep in range(reps):
                # --- local: reserved reward worker --------------------------------------------------
                busy = [0.0]

                async def score_local(traj: Trajectory) -> float:
                    reward, spent = await asyncio.wrap_future(reward_worker.submit(score_reserved, traj))
                    busy[0] += spent
                    return reward

                t_local, _ = asyncio.run(_rollout(n, turns, gen_ms, reward_ms, local_cores, rollout, score_local))
                rows.append({"arm": "local", "rep": rep, "rollout_s": round(t_local, 3),
                             "reward_busy_s": round(busy[0], 3), "reward_util": round(busy[0] / t_local, 4),
                             "rollout_cores": len(local_cores), "reward_cores": len(reserved)})
                # --- serverless: every core to rollout, reward on the service from zero replicas ----
                for arm, pool in (("serverless", rollout), ("serverless_equal_priority", rollout_equal)):
                    rows.append(_serverless_arm(arm, rep, service, router, pool, n, turns, gen_ms, reward_ms, cores))
        finally:
            service.stop()

    def median(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["arm"] == arm)

    ratios = {
        "rollout_time_local_vs_serverless": median("local", "rollout_s") / median("serverless", "rollout_s"),
        "reward_util_serverless": median("serverless", "reward_util"),
        "reward_util_local": median("local", "reward_util"),
        "rollout_time_local_vs_serverless_equal_priority":
            median("local", "rollout_s") / median("serverless_equal_priority", "rollout_s"),
        "reward_util_serverless_equal_priority": median("serverless_equal_priority", "reward_util"),
    }
    notes.append("paper: rollout 158 s → 77 s (2.05×), reward utilisation 6–7.4% → 88%")
    return BenchResult("reward", ratios, rows, notes)
