"""`rollart bench reward --jobs N`: N concurrent jobs on one shared reward service vs a reserved worker each.

The paper's shared reward pool reached 88% utilisation because many jobs fed it. Here N jobs run at once,
each in its own OS process (as N `rollart train` jobs would), each with its own run id, its own job token
and the real reward client (`RewardRouter`, backend `http`) — twice:

- `reserved`: every job has its own reward worker process; the reserved workers share the reserved cores
  (the upper half of this process's cores, 1 of 2 here) and the jobs' rollout runs on the others.
- `serverless`: one shared reward service (`RewardService(shared=True)`, what `rollart serve-reward` runs:
  Ray Serve on 127.0.0.1, autoscaling 0..`max_replicas`) scores every job's trajectories; rollout runs on
  every core. The arm starts with the service at zero replicas, so its cold start and scale-ups fall inside
  the timed window.

Workload (synthetic, stated plainly): generation is the single-job bench's stand-in — rollout processes
burn `gen_ms` of thread CPU time per turn, `turns` turns per trajectory, 2 per job — and the reward a
judge-like stand-in (`tagged_judge`) burning `reward_ms` of CPU per trajectory: a judge model, heavier
than the single-job bench's, at half the generation cost of a trajectory. Every trajectory is scored the
moment it finishes. All jobs use the same trajectory ids (`g000000/0` …), as real runs do; each
trajectory's reference carries a tag unique to its job, the reward returns it, and each job counts every
result that is not its own (`cross_job_results`, must be 0). Priorities as in the single-job bench: rollout
at nice 10, reward and Ray at 0 (`RAY_worker_niceness=0`).

Figures: `reward_util_serverless_multijob` = the service's busy time (per replica, time with at least one
scoring in progress, summed) ÷ its replica-seconds (running replicas sampled every 0.1 s) over the window
from the jobs' start to the last job's end (target ≥ 0.5; paper 0.88); `replicas_max` in that window
(target ≥ 2); `cross_job_results` (target 0); `rollout_time_reserved_vs_serverless_multijob` = median over
jobs of the reserved arm's rollout time ÷ the serverless arm's; `reward_util_reserved_multijob` = the
reserved workers' busy time ÷ (workers × the reserved arm's window).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from benchmarks.common import BenchResult
from benchmarks.reward_workload import NICE, burn_cpu, generate, pin, set_niceness, window_max
from rollart.types import Task, Trajectory, Turn

FN_SPEC = "benchmarks.reward_multijob:tagged_judge"
DOMAIN = "bench"


def tagged_judge(trajectory: Trajectory) -> float:
    """The bench's reward fn (run inside the Serve replicas): `reference['reward_ms']` of CPU, then the
    trajectory's tag — unique to its job, so a result delivered to the wrong job is seen."""
    burn_cpu(float(trajectory.reference["reward_ms"]))
    return float(trajectory.reference["tag"])


def job_trajectory(job: int, i: int, action: str, reward_ms: float) -> Trajectory:
    trajectory_id = f"g{i:06d}/0"  # the same ids in every job, as in real runs
    task = Task(trajectory_id, DOMAIN, "math", i, f"g{i:06d}")
    return Trajectory(trajectory_id, task, 0, (Turn((), (), (), (), action=action),),
                      reference={"tag": 1_000_000 * (job + 1) + i, "reward_ms": reward_ms})


def _score_reserved(trajectory: Trajectory) -> tuple[float, float]:
    t0 = time.monotonic()
    reward = tagged_judge(trajectory)
    return reward, time.monotonic() - t0


def run_job(job: int, arm: str, spec: dict[str, Any], ready: Any, go: Any, out: Any) -> None:
    """One job (its own process): set up, say `ready`, wait for `go`, roll out and score `n` trajectories,
    report to `out`."""
    n, turns, gen_ms, reward_ms = spec["n"], spec["turns"], spec["gen_ms"], spec["reward_ms"]
    rollout_cores, reserved_cores = tuple(spec["rollout_cores"]), tuple(spec["reserved_cores"])
    rollout = ProcessPoolExecutor(2, initializer=set_niceness, initargs=(NICE,))
    reserved = ProcessPoolExecutor(1, initializer=pin, initargs=(reserved_cores,)) if arm == "reserved" else None
    router = None
    try:
        list(rollout.map(generate, range(2), [0, 0], [0.0, 0.0], [rollout_cores] * 2))  # processes up first
        busy = [0.0]
        if reserved is not None:
            reserved.submit(_score_reserved, job_trajectory(job, -1, "", 0.0)).result()

            async def score(traj: Trajectory) -> Any:
                reward, spent = await asyncio.wrap_future(reserved.submit(_score_reserved, traj))
                busy[0] += spent
                return reward, time.monotonic()
        else:
            from rollart.config import DomainConfig, RunConfig
            from rollart.reward import RewardRouter

            cfg = RunConfig(domains={DOMAIN: DomainConfig(env="math", reward={"fn": FN_SPEC, "backend": "http"})})
            cfg.reward.http.url, cfg.reward.timeout_s = spec["url"], 60.0
            os.environ[cfg.reward.http.token_env] = spec["token"]  # this job's own token
            router = RewardRouter(cfg).start()

            async def score(traj: Trajectory) -> Any:
                return await router.score(traj), time.monotonic()

        ready.put(job)
        go.wait()

        async def one(i: int) -> tuple[int, Any, float, float]:
            action = await asyncio.wrap_future(rollout.submit(generate, i, turns, gen_ms, rollout_cores))
            finished = time.monotonic()
            result, scored = await score(job_trajectory(job, i, action, reward_ms))
            return i, result, finished, scored

        async def all_of_them() -> list[tuple[int, Any, float, float]]:
            return await asyncio.gather(*(one(i) for i in range(n)))

        t0 = time.monotonic()
        done = asyncio.run(all_of_them())
        rollout_s = time.monotonic() - t0
        latencies = sorted(scored - finished for _, _, finished, scored in done)
        if arm == "reserved":
            rewards = {i: r for i, r, _, _ in done}
            failures = 0
        else:
            rewards = {i: r.reward for i, r, _, _ in done if r.ok}
            failures = sum(not r.ok for _, r, _, _ in done)
        wrong = sum(rewards[i] != 1_000_000 * (job + 1) + i for i in rewards)
        out.put({"job": job, "arm": arm, "rollout_s": rollout_s, "busy_s": busy[0], "failures": failures,
                 "cross_job_results": wrong, "p50_s": latencies[len(latencies) // 2],
                 "p95_s": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
                 "t_start": time.time() - rollout_s, "t_end": time.time()})
    finally:
        rollout.shutdown(cancel_futures=True)
        if reserved is not None:
            reserved.shutdown(cancel_futures=True)
        if router is not None:
            router.stop()


def _arm(arm: str, jobs: int, spec: dict[str, Any], tokens: list[str], timeout_s: float) -> list[dict[str, Any]]:
    """Start the jobs, let them all begin at once (after each has its processes and client up), collect."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=run_job, args=(j, arm, {**spec, "token": tokens[j]}, ready, go, out))
             for j in range(jobs)]
    for p in procs:
        p.start()
    rows = []
    try:
        waiting, deadline = set(range(jobs)), time.monotonic() + 300
        while waiting:
            dead = [j for j in waiting if procs[j].exitcode is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{arm} arm: jobs {dead or sorted(waiting)} "
                                   f"{'died' if dead else 'were not ready within 300 s'} before starting")
            try:
                waiting.discard(ready.get(timeout=1))
            except queue.Empty:
                pass
        go.set()
        for _ in range(jobs):
            rows.append(out.get(timeout=timeout_s))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return sorted(rows, key=lambda r: r["job"])


def run(quick: bool, jobs: int) -> BenchResult:
    from rollart.config import DomainConfig, RunConfig
    from rollart.resources import Runtime
    from rollart.reward import tokens as job_tokens
    from rollart.reward.service import SHARED_APP, RewardService

    n, turns, gen_ms, reward_ms, reps = (16, 2, 50.0, 50.0, 1) if quick else (48, 4, 50.0, 100.0, 2)
    cores = tuple(sorted(os.sched_getaffinity(0)))
    if len(cores) < 2:
        raise RuntimeError(f"the reward bench needs at least 2 cores to reserve one for reward; this process has {cores}")
    reserved_cores, local_cores = cores[len(cores) // 2:], cores[: len(cores) // 2]
    os.environ["RAY_worker_niceness"] = "0"  # reward replicas at nice 0 like the reserved workers (see reward.py)
    cfg = RunConfig(domains={DOMAIN: DomainConfig(env="math", reward={"fn": FN_SPEC, "backend": "serverless"})})
    cfg.cluster.num_cpus = len(cores)
    cfg.pools["reward"].capacity = 3
    sl = cfg.reward.serverless
    sl.min_replicas, sl.max_replicas, sl.target_ongoing_requests, sl.downscale_delay_s = 0, 3, 2.0, 3.0
    sl.max_ongoing_requests = 8
    base = {"n": n, "turns": turns, "gen_ms": gen_ms, "reward_ms": reward_ms}
    rows: list[dict[str, Any]] = []
    notes = [
        f"{jobs} jobs at once, each its own process with its own run id and job token; per job {n} trajectories "
        f"× {turns} turns × {gen_ms:g} ms CPU of synthetic generation (2 rollout processes, nice {NICE}); "
        f"reward = {reward_ms:g} ms CPU judge stand-in per trajectory, scored on finish",
        f"reserved: rollout on cores {list(local_cores)}, one reward worker per job, all pinned to "
        f"{list(reserved_cores)}; serverless: rollout on {list(cores)}, one shared Ray Serve service "
        f"0..{sl.max_replicas} replicas (target {sl.target_ongoing_requests:g} ongoing), from zero replicas",
        f"load average at start: {os.getloadavg()[0]:.2f} (the machine is shared; ratios are side by side)",
    ]
    with Runtime(cfg):
        service = RewardService(cfg, app_name=SHARED_APP, shared=True, poll_s=0.1)
        service.start()
        names = [f"bench-job-{j}" for j in range(jobs)]
        toks = [job_tokens.issue(service.token, name) for name in names]
        try:
            for rep in range(reps):
                reserved = _arm("reserved", jobs, {**base, "rollout_cores": local_cores,
                                                    "reserved_cores": reserved_cores}, toks, 900)
                window = max(r["t_end"] for r in reserved) - min(r["t_start"] for r in reserved)
                for r in reserved:
                    rows.append({**r, "rep": rep, "reward_util": round(r["busy_s"] / window, 4)})
                deadline = time.monotonic() + 120
                while service.replicas.current > 0 and time.monotonic() < deadline:  # from zero replicas
                    time.sleep(0.2)
                before, replica_s0 = service.stats(), service.replicas.integral()
                serverless = _arm("serverless", jobs, {**base, "rollout_cores": cores, "reserved_cores": cores,
                                                       "url": service.url}, toks, 900)
                t0, t1 = min(r["t_start"] for r in serverless), max(r["t_end"] for r in serverless)
                time.sleep(0.5)  # the replicas' last busy reports (fire and forget) land
                after = service.stats()
                replica_s = service.replicas.integral() - replica_s0
                busy = after["busy_s"] - before["busy_s"]
                summary = {"arm": "serverless-service", "rep": rep, "window_s": round(t1 - t0, 3),
                           "busy_s": round(busy, 3), "replica_s": round(replica_s, 3),
                           "reward_util": round(busy / replica_s, 4) if replica_s > 0 else 0.0,
                           "replicas_max": window_max(service.replica_timeline(), t0, t1),
                           "replica_starts": after["replica_starts"] - before["replica_starts"],
                           "ledger_bytes": after["bytes"], "conflicts": after["conflicts"] - before["conflicts"]}
                rows.extend({**r, "rep": rep} for r in serverless)
                rows.append(summary)
        finally:
            service.stop()

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["arm"] == arm)

    jobs_rows = [r for r in rows if r["arm"] in ("reserved", "serverless")]
    ratios = {
        "reward_util_serverless_multijob": med("serverless-service", "reward_util"),
        "replicas_max": max(r["replicas_max"] for r in rows if r["arm"] == "serverless-service"),
        "cross_job_results": float(sum(r["cross_job_results"] for r in jobs_rows)),
        "failed_scorings": float(sum(r["failures"] for r in jobs_rows)),
        "rollout_time_reserved_vs_serverless_multijob": med("reserved", "rollout_s") / med("serverless", "rollout_s"),
        "reward_util_reserved_multijob": med("reserved", "reward_util"),
    }
    notes.append("targets: reward_util_serverless_multijob ≥ 0.5 (paper's shared pool 0.88), replicas_max ≥ 2, "
                 "cross_job_results 0")
    for r in rows:
        for k in ("rollout_s", "busy_s", "p50_s", "p95_s"):
            if k in r:
                r[k] = round(r[k], 4)
        r.pop("t_start", None)
        r.pop("t_end", None)
    return BenchResult("reward", ratios, rows, notes)
