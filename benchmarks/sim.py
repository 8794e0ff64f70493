"""`rollart bench sim`: the paper's scale experiments on the cluster twin, and the twin's own speed and accuracy.

Each experiment runs the production control plane in virtual time (rollart.sim) on a preset of
rollart/sim/presets.py; ratios are measured side by side in one run. Reported:

- `wall_s_1000gpu_50steps`: real seconds the twin takes for 50 RL steps of 1,000 GPUs with ~10,000
  trajectories in flight (target ≤ 120 on the 2-core build machine);
- `sim_vs_real_rollout_error`: largest relative error of the twin's `bench rollout` ratios against this
  machine's measured ones (`benchmarks/rollout.json`, a real run; target ≤ 0.15);
- `traj_vs_batch_sigma_<σ/μ>_paper_scale`: trajectory-level rollout over a turn barrier at the paper's batch
  (512 × group 8) under env latency N(10 s, σ) (paper: 1.23× at σ = 1 s, 2.27× at σ = 10 s);
- `mixed_vs_homogeneous_best`: step time of the best equal-cost homogeneous cluster (208 H20 or 72 H800) over
  the mixed 64 H800 + 24 H20 one with its best domain mapping (paper: 1.12–1.68);
- `async_vs_sync_throughput_1000gpu`, `async_vs_oneoff_throughput_1000gpu` (paper: 2.65–4.58× vs Sync, async
  above one-off) and `async_redundant_vs_oneoff_throughput_1000gpu`: async with half a batch of redundant
  groups (the stragglers cancelled), what over-admission adds at this scale; the rows carry the trajectories
  started and cancelled as stale, and each pool's busy fraction;
- `weight_sync_exposed_fraction_<8b|32b>`: exposed weight-sync time, bucketed and overlapped over naive
  (paper: 1.4/38.6 and 9.6/157 s);
- `plan_vs_exhaustive`: the planner's choice over the exhaustive best, both scored by the twin (≥ 0.95);
- `remap_recovered_fraction`: after a workload shift, the throughput online re-mapping wins back, as a
  fraction of what the best mapping for the new workload would give (and `remap_throughput_lost_fraction`);
- `reward_util_*`: reward utilisation, reserved GPUs vs a serverless pool shared by one or three jobs
  (paper: 6% vs 88% with three jobs), and the rollout time the four reserved GPUs cost when given back.

`--quick` runs every experiment small (a smoke test, under a minute).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult
from benchmarks.rollout import SIGMAS, _measure, bench_config, rollout_seconds
from rollart.config import DomainProfileConfig
from rollart.plan import plan
from rollart.plan.search import twin_remapper
from rollart.sim import presets
from rollart.sim.calibration import build_machine, frozenlake_tiny, with_profiles
from rollart.sim.clock import run_virtual
from rollart.sim.reward import SimRewardPool
from rollart.sim.run import SimReport, simulate, simulate_async
from rollart.sim.system import SimSystem

REAL_ROLLOUT = Path(__file__).resolve().parent / "rollout.json"


# --- the twin against the real bench -------------------------------------------------------------------
def rollout_ratios_vs_real(real: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """The twin's `bench rollout` ratios at the scales of a real run's JSON, and each one's relative error."""
    twin: dict[str, float] = {}
    errors: dict[str, float] = {}
    scales = sorted({(r["batch"], r["turns"]) for r in real["rows"]})
    for batch, turns in scales:
        with tempfile.TemporaryDirectory(prefix="rollart-sim-") as run_dir:
            cfg = with_profiles(bench_config(1.0, turns, batch, run_dir), frozenlake_tiny(turns))

            async def measure() -> list[dict]:
                system = SimSystem(cfg, build_machine())
                try:
                    return await _measure(system, 2)
                finally:
                    await system.close()

            rows = run_virtual(measure())
        for rel in SIGMAS:
            by = {r["barrier"]: r["s_per_batch"] for r in rows if r["sigma_over_mu"] == rel}
            key = f"traj_vs_turn_barrier_sigma_{rel}_b{batch}_t{turns}"
            twin[key] = by["turn"] / by["none"]
            errors[key] = abs(twin[key] - real["ratios"][key]) / real["ratios"][key]
    return twin, errors


# --- the experiments ------------------------------------------------------------------------------------
def _paper_scale_rollout(quick: bool) -> tuple[dict[str, float], list[dict]]:
    """Figure 11b: trajectory-level vs batch (turn-barrier) rollout, batch 512 × 8, env N(10 s, σ)."""
    batch, turns = (64, 4) if quick else (512, 10)
    ratios, rows = {}, []
    for rel in SIGMAS:
        name = f"env_sigma{round(rel * 10):02d}"
        # FrozenLake-like turns (short moves): generation is small beside 10 s of env, as in the paper's sweep
        domain = presets.task("frozenlake", "h800", turns={"dist": "constant", "mean": turns}) | {
            "inject": {"step_latency": {"dist": "gaussian", "mean_s": 10.0, "std_s": 10.0 * rel}}}
        cfg = presets.run_config({name: domain}, batch=batch, steps=2, alpha=0, barrier="turn", pools=("h800",))
        hw = presets.hardware({"h800": ("H800", 32, 1)})

        async def measure() -> dict[str, float]:
            system = SimSystem(cfg, hw)
            try:
                free = sum(await rollout_seconds(system, name, False, 2)) / 2
                barrier = sum(await rollout_seconds(system, name, True, 2)) / 2
                return {"none": free, "turn": barrier}
            finally:
                await system.close()

        by = run_virtual(measure())
        ratios[f"traj_vs_batch_sigma_{rel}_paper_scale"] = by["turn"] / by["none"]
        rows.append({"experiment": "traj_vs_batch", "sigma_over_mu": rel, "batch": batch, "turns": turns,
                     "s_per_batch_none": round(by["none"], 2), "s_per_batch_turn": round(by["turn"], 2)})
    return ratios, rows


GEN_DOMAINS = ("frozenlake", "math", "game")  # the generation-heavy kinds: where the hardware matters
EQUAL_COST = {  # the paper's §7.3 clusters (generation GPUs; training on 32 H800 in each)
    "mixed_64xH800_24xH20": {"h800": ("H800", 64, 2), "h20": ("H20", 24, 2)},
    "homogeneous_208xH20": {"h20": ("H20", 208, 2)},
    "homogeneous_72xH800": {"h800": ("H800", 72, 2)},
}


def _mixed_vs_homogeneous(quick: bool) -> tuple[dict[str, float], list[dict]]:
    """Figure 11a: the mixed cluster with its best domain → pool mapping (the twin tries them all) against
    the two homogeneous clusters of about the same price, on the generation-heavy task kinds."""
    steps, batch = (3, 96) if quick else (5, 512)
    rows, step_s = [], {}
    for name, pools in EQUAL_COST.items():
        names = tuple(pools)
        mappings = [m for m in itertools.product(names, repeat=len(GEN_DOMAINS)) if set(m) == set(names)]
        for assignment in mappings:
            cfg = presets.run_config(presets.mapped(dict(zip(GEN_DOMAINS, assignment))), batch=batch, steps=steps,
                                     pools=names)
            report = simulate(cfg, presets.hardware(pools))
            label = f"{name} " + ", ".join(f"{d}→{p}" for d, p in zip(GEN_DOMAINS, assignment))
            step_s[label] = report.mean_step_s()
            rows.append({"experiment": "equal_cost", "cluster": label, "price_per_hour": round(report.price_per_hour, 1),
                         "mean_step_s": round(step_s[label], 2),
                         **{f"busy_{p}": round(v["busy_fraction"], 3) for p, v in report.pools.items()}})
    best = {name: min(v for k, v in step_s.items() if k.startswith(name)) for name in EQUAL_COST}
    mixed = best["mixed_64xH800_24xH20"]
    ratios = {
        "mixed_vs_homogeneous_h20": best["homogeneous_208xH20"] / mixed,
        "mixed_vs_homogeneous_h800": best["homogeneous_72xH800"] / mixed,
        "mixed_paper_mapping_vs_homogeneous_best": min(best["homogeneous_208xH20"], best["homogeneous_72xH800"])
        / step_s["mixed_64xH800_24xH20 frozenlake→h800, math→h20, game→h20"],
    }
    ratios["mixed_vs_homogeneous_best"] = min(ratios["mixed_vs_homogeneous_h20"], ratios["mixed_vs_homogeneous_h800"])
    return ratios, rows


def _async_vs_sync(quick: bool, fast_report: SimReport | None) -> tuple[dict[str, float], list[dict]]:
    steps = 3 if quick else 8
    rows, tput = [], {}
    modes = (("async", 1, "none", False), ("async_redundant", 1, "none", True), ("one_off", 1, "batch", False),
             ("sync", 0, "batch", False))
    for mode, alpha, barrier, redundant in modes:
        if mode == "async" and fast_report is not None:
            report = fast_report
        else:
            cfg, hw = presets.thousand_gpus(alpha=alpha, barrier=barrier, steps=steps)
            if quick:
                cfg, hw = _small(cfg, hw)
            if redundant:  # half a batch of extra groups
                ro = cfg.rollout
                redundancy = ro.redundancy.model_copy(update={"extra_groups": ro.batch_size // ro.group_size // 2})
                cfg = cfg.model_copy(update={"rollout": ro.model_copy(update={"redundancy": redundancy})})
            report = simulate(cfg, hw)
        # over the same steps in every mode: the async run may be the 50-step fast run, and a mean over its
        # 50 steps is not comparable with one over the other modes' 8
        tput[mode] = report.steady_trajectories_per_s(upto=steps)
        rows.append({"experiment": "async_vs_sync", "mode": mode, "steps": min(steps, len(report.steps)),
                     "mean_step_s": round(report.mean_step_s(upto=steps), 2),
                     "trajectories_per_s": round(tput[mode], 2),
                     "mean_step_s_all_steps": round(report.mean_step_s(), 2), "steps_run": len(report.steps),
                     "started": report.counters.get("rollout/started", 0.0),
                     "stale": report.counters.get("buffer/stale", 0.0),
                     "wasted_tokens": report.counters.get("buffer/wasted_tokens", 0.0),
                     "busy_fraction": {p: round(v["busy_fraction"], 3) for p, v in report.pools.items()}})
    return {"async_vs_sync_throughput_1000gpu": tput["async"] / tput["sync"],
            "async_vs_oneoff_throughput_1000gpu": tput["async"] / tput["one_off"],
            "async_redundant_vs_oneoff_throughput_1000gpu": tput["async_redundant"] / tput["one_off"]}, rows


def _small(cfg: Any, hw: Any) -> tuple[Any, Any]:
    """A quick stand-in of the 1,000-GPU preset: a tenth of everything."""
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"batch_size": 512})})
    hw = presets.hardware({"h800": ("H800", 52, 2), "h20": ("H20", 24, 2)}, train=("H800", 26))
    return cfg, hw


def _weight_sync(quick: bool) -> tuple[dict[str, float], list[dict]]:
    ratios, rows = {}, []
    for model in ("qwen3-8b", "qwen3-32b"):
        exposed = {}
        for overlap in (False, True):
            cfg = presets.run_config(presets.mapped({"math": "h20", "frozenlake": "h800"}), batch=128 if quick else 512,
                                     steps=3 if quick else 5)
            tp = 2 if model == "qwen3-32b" else 1
            hw = presets.hardware({"h800": ("H800", 32, tp), "h20": ("H20", 32, tp)}, model=model,
                                  weights={"link": "rdma_400g", "overlap": overlap, "bucket_gb": 1.0})
            report = simulate(cfg, hw)
            exposed[overlap] = sum(report.sync_exposed_s[1:]) / max(len(report.sync_exposed_s) - 1, 1)
            rows.append({"experiment": "weight_sync", "model": model, "overlap": overlap,
                         "mean_exposed_s": round(exposed[overlap], 2)})
        ratios[f"weight_sync_exposed_fraction_{model.split('-')[1]}"] = exposed[True] / exposed[False]
    return ratios, rows


def _serverless_reward(quick: bool) -> tuple[dict[str, float], list[dict]]:
    """Figure 12: three math jobs on 16 H800; reward on 4 reserved H800 (12 generate) or on a shared
    serverless pool (all 16 generate)."""
    batch, steps = (64, 3) if quick else (256, 5)
    judge = ["domains.math.profile.reward.dist=lognormal", "domains.math.profile.reward.mean_s=4.0",
             "domains.math.profile.reward.std_s=2.0"]
    cfg = presets.run_config(presets.mapped({"math": "h800"}), batch=batch, steps=steps, pools=("h800",), extra=judge)
    rows, ratios = [], {}

    async def jobs(n: int, reward: dict, gpus: int) -> tuple[list[SimReport], SimRewardPool]:
        hw = presets.hardware({"h800": ("H800", gpus, 1)}, reward=reward)
        pool = SimRewardPool(hw.reward)
        started = time.perf_counter()
        reports = await asyncio.gather(*(simulate_async(cfg.model_copy(update={"seed": i}), hw, pool, None, started)
                                         for i in range(n)))
        return list(reports), pool

    reserved = {"mode": "reserved", "workers": 4, "concurrency": 8}
    # a function-compute service bills a replica only while it runs (one request each, released at once)
    serverless = {"mode": "serverless", "concurrency": 1, "scale_down_s": 0.0, "cold_start_s": 2.0,
                  "max_replicas": 512}
    for name, n, reward, gpus in (("reserved_1job", 1, reserved, 12), ("serverless_1job", 1, serverless, 16),
                                  ("reserved_3jobs", 3, reserved, 12), ("serverless_3jobs", 3, serverless, 16)):
        reports, pool = run_virtual(jobs(n, reward, gpus))
        end = max(r.virtual_s for r in reports)
        stats = pool.stats(end)
        step = sum(r.mean_step_s() for r in reports) / len(reports)
        ratios[f"reward_util_{name}"] = stats["utilisation"]
        rows.append({"experiment": "reward", "arm": name, "jobs": n, "mean_step_s": round(step, 2),
                     "reward_utilisation": round(stats["utilisation"], 3), "reward_wait_s": round(stats["mean_wait_s"], 2),
                     "replica_starts": stats["replica_starts"]})
    steps_by = {r["arm"]: r["mean_step_s"] for r in rows}
    ratios["rollout_time_reserved_vs_serverless_3jobs"] = steps_by["reserved_3jobs"] / steps_by["serverless_3jobs"]
    return ratios, rows


def _plan_vs_exhaustive(quick: bool) -> tuple[dict[str, float], list[dict]]:
    """The planner's choice (analytic top 4 + best homogeneous, twin-scored) over the exhaustive twin best, on
    the generation-heavy tasks (FrozenLake, math, game: their mapping matters) at $108/h of generation GPUs
    (48 H800, or 144 H20, or a mix, in nodes of 8)."""
    cfg = presets.run_config(presets.mapped({d: "h800" for d in ("frozenlake", "math", "game")}),
                             batch=48 if quick else 240, steps=3 if quick else 4)
    hw = presets.hardware({"h800": ("H800", 8, 2)})
    budget = 54.0 if quick else 108.0
    every = plan(cfg, hw, ["H800", "H20"], budget, node=8, tp=2, steps=3 if quick else 4, exhaustive=True)
    best = max(s.score or 0.0 for s in every.scored)
    picked = sorted(every.scored, key=lambda s: -s.estimate)[:4]
    picked += [max((s for s in every.scored if s.candidate.homogeneous and s.candidate.pools[0][1] == k),
                   key=lambda s: s.estimate) for k in ("H800", "H20")]
    chosen = max(picked, key=lambda s: s.score or 0.0)
    rows = [{"experiment": "plan", "candidate": s.candidate.describe(), "estimate": round(s.estimate * 3600, 3),
             "twin_trajectories_per_dollar": round((s.score or 0.0) * 3600, 3), "picked": s in picked}
            for s in sorted(every.scored, key=lambda s: -(s.score or 0.0))]
    homo = max((s for s in every.scored if s.candidate.homogeneous), key=lambda s: s.score or 0.0)
    return {"plan_vs_exhaustive": (chosen.score or 0.0) / best,
            "plan_gain_over_homogeneous": (chosen.score or 0.0) / (homo.score or 1.0)}, rows


def _remap(quick: bool) -> tuple[dict[str, float], list[dict]]:
    """A workload shift mid-run: `math` (one long answer, on H20) turns into a prefill-heavy multi-turn task
    at version 3. Post-shift throughput without re-mapping, with `rollout.remap=auto` (the profiler confirms
    the drift on fresh turns, the planner's twin scores the mappings of the running pools), and with the
    best mapping for the shifted workload from the start; `remap_recovered_fraction` = (remap − none) ÷
    (best − none), over every step after the shift (detection delay included). Batch 128: at 256, with two
    batches in flight, the 8 H800 lack the KV for the shifted math's long contexts, staying on H20 is best
    and there is nothing for a re-mapping to win back (the planner then rightly moves nothing)."""
    steps, shift_at, batch = (9, 3, 128) if quick else (14, 3, 128)
    lake = presets.task("frozenlake", "h800", turns={"mean": 6}, response_tokens={"mean": 40})
    math = presets.task("math", "h20", response_tokens={"mean": 2000}) | {"max_turns": 8}
    shifted = DomainProfileConfig.model_validate({"turns": {"mean": 6}, "prompt_tokens": {"mean": 4000},
                                                  "obs_tokens": {"mean": 3000}, "response_tokens": {"mean": 40}})
    hw = presets.hardware({"h800": ("H800", 8, 1), "h20": ("H20", 24, 1)}, train=("H800", 128))

    def run(remap: str, start: int, math_pool: str, lake_pool: str) -> float:
        cfg = presets.run_config({"frozenlake": {**lake, "pool": lake_pool}, "math": {**math, "pool": math_pool}},
                                 batch=batch, steps=steps, extra=[f"rollout.remap={remap}", "rollout.remap_drift=0.5"])
        report = simulate(cfg, hw, shifts={"math": (start, shifted)}, remapper=twin_remapper(6))
        post = report.steps[shift_at + 1:]
        rows.append({"experiment": "remap", "remap": remap, "shift_at_version": start, "math": math_pool,
                     "frozenlake": lake_pool, "post_shift_trajectories_per_s": round(
                         sum(s["trajectories"] for s in post) / sum(s["step_s"] for s in post), 3),
                     "remaps": report.extra["remaps"]})
        return rows[-1]["post_shift_trajectories_per_s"]

    rows: list[dict] = []
    unshifted = run("none", 10**9, "h20", "h800")
    none = run("none", shift_at, "h20", "h800")
    auto = run("auto", shift_at, "h20", "h800")
    best = max(run("none", 0, m, f) for m, f in (("h800", "h20"), ("h800", "h800"), ("h20", "h20")))
    return {"remap_throughput_lost_fraction": 1 - none / unshifted,
            "remap_recovered_fraction": (auto - none) / (best - none) if best > none else 0.0}, rows


def run(quick: bool) -> BenchResult:
    ratios: dict[str, float] = {}
    rows: list[dict] = []
    notes = ["every figure is from the twin (virtual time, production control plane, cost models of "
             "rollart/sim/costs.py with the catalogue's figures); no GPU ran"]

    started = time.perf_counter()
    cfg, hw = presets.thousand_gpus(steps=3 if quick else 50)
    if quick:
        cfg, hw = _small(cfg, hw)
    fast = simulate(cfg, hw)
    wall = time.perf_counter() - started
    ratios["wall_s_1000gpu_50steps" if not quick else "wall_s_small_3steps"] = wall
    peak_in_flight = max(s.get("rollout/running_peak", 0.0) for s in fast.steps)  # trajectories at once
    rows.append({"experiment": "fast", "gpus": sum(p.count for p in hw.pools.values()), "steps": len(fast.steps),
                 "wall_s": round(wall, 1), "virtual_s": round(fast.virtual_s, 1), "peak_in_flight": peak_in_flight,
                 "ledger_violations": len(fast.ledger_violations),
                 "staleness_violations": len(fast.staleness_violations)})

    real = json.loads(REAL_ROLLOUT.read_text())
    twin, errors = rollout_ratios_vs_real(real)
    ratios["sim_vs_real_rollout_error"] = max(errors.values())
    rows += [{"experiment": "sim_vs_real", "ratio": k, "twin": round(twin[k], 3), "real": round(real["ratios"][k], 3)}
             for k in twin]
    notes.append(f"sim_vs_real compares with benchmarks/rollout.json (real run of {real['date']}, commit "
                 f"{real['commit']})")

    for experiment in (_paper_scale_rollout, _mixed_vs_homogeneous, _weight_sync, _serverless_reward,
                       _plan_vs_exhaustive, _remap):
        r, w = experiment(quick)
        ratios.update(r)
        rows += w
    r, w = _async_vs_sync(quick, fast)
    ratios.update(r)
    rows += w
    return BenchResult("sim", ratios, rows, notes)
