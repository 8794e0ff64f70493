"""`rollart bench overhead`: what one trajectory costs — rollart beside TRL's GRPOTrainer on single-turn math.

The job: the default config's math domain alone (`domains.frozenlake=null`), batches of 36 in groups of 4,
150 GRPO steps, from one warm start (the default job's 100 supervised steps on both its domains'
demonstrations, built once by `rollart.job.driver.warm_start_checkpoint`). Two arms, one after the other, each
in a fresh Python interpreter of its own (as is the warm start: `in_fresh_process`), so neither inherits the
other's threads, imports, model or allocator state — and this process, which only waits, runs nothing between:
- `trl`: the same job through TRL's `GRPOTrainer` on CPU (`overhead_trl.py` says what is matched and what
  is not);
- `rollart`: `rollart.job.driver.train` from the same base (no warm start of its own, no evaluation inside
  the loop), while `process_cpu.CpuSampler` reads every process's CPU seconds.
Both trained models are scored by rollart's evaluation (64 greedy validation episodes): TRL's from its saved
checkpoint (`rollart.job.driver.evaluate`), rollart's by its own last evaluation — the same function.

Reported:
- `rollart_vs_trl_rl_wall`: rollart's RL-loop wall ÷ TRL's (target ≤ 1.0). rollart's loop runs from its first
  RL step to its last step record (`time/step` summed, the last train step's landing excluded); TRL's is
  `trainer.train()`.
- `cpu_ms_per_trajectory_overhead`: CPU milliseconds per trained trajectory of every process but the engines
  and the trainer (generation and training), the driver included (target ≤ 15);
- `reward_p50_ms`: the median reward span of the trained trajectories (from timeline.json; target ≤ 20);
- rows: each arm's wall, CPU, score; rollart's CPU seconds per role and per trajectory.
`--quick`: 3 RL steps of 8 (groups of 4) from a 5-step warm start, 8 evaluation episodes.
"""

from __future__ import annotations

import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult
from benchmarks.process_cpu import CpuSampler

DOMAIN = "math"
GENERATION_AND_TRAINING = ("engine", "trainer")
PART_TIMEOUT_S = 1800  # the warm start or one arm, in its own process (each takes 1-2 minutes here)


def job_overrides(quick: bool) -> list[str]:
    """The math-only job of the issue (quick: its smallest form)."""
    steps, batch, episodes, warm = (3, 8, 8, 5) if quick else (150, 36, 64, 100)
    return ["domains.frozenlake=null", f"train.steps={steps}", f"rollout.batch_size={batch}", "rollout.group_size=4",
            f"eval.episodes_per_domain={episodes}", f"eval.every={steps}", f"train.warm_start.steps={warm}",
            "observability.progress=quiet", "observability.tensorboard=false", "observability.samples_per_domain=0",
            "observability.timeline_max_trajectories=100000"]


def run(quick: bool) -> BenchResult:
    from rollart.config.loader import load_config

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rollart-bench-overhead-") as tmp:
        work = Path(tmp)
        # the default job's warm start (both domains' demonstrations, as `rollart train` does), then RL on math
        base_cfg = load_config(None, [f"run_dir={work / 'base-run'}",
                                      *(o for o in job_overrides(quick) if o != "domains.frozenlake=null")])
        began = time.perf_counter()
        base = in_fresh_process(warm_start, base_cfg, work / "base")
        warm_s = time.perf_counter() - began
        cfg = load_config(None, [f"run_dir={work / 'rollart'}", *job_overrides(quick), f"model.path={base}",
                                 "train.warm_start.steps=0"])
        trl = in_fresh_process(trl_arm, cfg, work)
        ours = in_fresh_process(rollart_arm, cfg)
    trajectories = ours["trajectories"]
    overhead_s = sum(v for k, v in ours["cpu_by_role"].items() if k not in GENERATION_AND_TRAINING)
    rows.append({"arm": "trl", "rl_wall_s": round(trl["rl_wall_s"], 1), "cpu_s": round(trl["cpu_s"], 1),
                 "cpu_ms_per_trajectory": round(1000 * trl["cpu_s"] / trajectories, 1),
                 "eval_last": trl["eval_last"], "torch_threads": trl["torch_threads"]})
    rows.append({"arm": "rollart", "rl_wall_s": round(ours["rl_wall_s"], 1), "cpu_s": round(sum(ours["cpu_by_role"].values()), 1),
                 "cpu_ms_per_trajectory": round(1000 * sum(ours["cpu_by_role"].values()) / trajectories, 1),
                 "eval_first": ours["eval_first"], "eval_last": ours["eval_last"],
                 "step_s_median": ours["step_s_median"], "train_s_median": ours["train_s_median"],
                 "get_batch_wait_s_median": ours["get_batch_wait_s_median"]})
    for role, seconds in sorted(ours["cpu_by_role"].items(), key=lambda kv: -kv[1]):
        rows.append({"role": role, "cpu_s": round(seconds, 2), "cpu_ms_per_trajectory": round(1000 * seconds / trajectories, 2)})
    ratios = {
        "rollart_vs_trl_rl_wall": ours["rl_wall_s"] / trl["rl_wall_s"],
        "cpu_ms_per_trajectory_overhead": 1000 * overhead_s / trajectories,
        "reward_p50_ms": ours["reward_p50_ms"],
        "eval_last_rollart_minus_trl": ours["eval_last"] - trl["eval_last"],
    }
    notes = [
        f"{trajectories} trained trajectories per arm; warm start {warm_s:.0f} s (shared, not timed in either arm); "
        f"first evaluation {ours['eval_first']:.3f}",
        f"TRL: {trl['prompts_checked']} prompts checked token for token against rollart's; its process ran "
        f"{trl['torch_threads']} torch threads; train reward {trl['train_reward_first']} → {trl['train_reward_last']}",
        "not matched: TRL is synchronous and on-policy, rollart trains at α = 1 with truncated importance weights; "
        "TRL generates with transformers.generate in its trainer's process (see benchmarks/overhead_trl.py)",
        f"rollart: train reward {ours['train_reward'][0]} (first 10 steps) → {ours['train_reward'][1]} (last 10), "
        f"{ours['response_tokens']} response tokens per trajectory; TRL: completions of "
        f"{trl['completion_tokens']} tokens on average",
        f"rollart reward p95 {ours['reward_p95_ms']:.1f} ms; CPU outside generation and training "
        f"{overhead_s:.1f} s in all",
        "ray_other_actors: " + ", ".join(f"{t} {s:.2f} s" for t, s in
                                         sorted(ours["other_actors"].items(), key=lambda kv: -kv[1])[:6]),
    ]
    return BenchResult("overhead", ratios, rows, notes)


# what a part's interpreter runs: `module.name(*args)` from a pickle, its result (or traceback) to another
PART_MAIN = """
import importlib, pickle, sys, traceback
module, name, args_path, out_path = sys.argv[1:5]
try:
    with open(args_path, "rb") as f:
        args = pickle.load(f)
    out = (True, getattr(importlib.import_module(module), name)(*args))
except BaseException:
    out = (False, traceback.format_exc())
with open(out_path, "wb") as f:
    pickle.dump(out, f)
"""


def in_fresh_process(part: Callable[..., Any], *args: Any) -> Any:
    """`part(*args)` (a module-level function, picklable arguments and result) in a new Python interpreter
    (`python -c`: nothing of this process is inherited but its environment) and its result returned here; its
    exception is raised here as a RuntimeError with its traceback; one that runs past `PART_TIMEOUT_S` is killed
    (subprocess.TimeoutExpired). Not `multiprocessing`: a rollart arm run as a spawn child was 20-30% slower,
    every Ray process of its job using more CPU (benchmarks/RESULTS.md, "## overhead", 2026-12-04 evening)."""
    with tempfile.TemporaryDirectory(prefix="rollart-bench-part-") as tmp:
        args_path, out_path = Path(tmp) / "args.pkl", Path(tmp) / "out.pkl"
        args_path.write_bytes(pickle.dumps(args))
        done = subprocess.run([sys.executable, "-c", PART_MAIN, part.__module__, part.__name__, str(args_path),
                               str(out_path)], timeout=PART_TIMEOUT_S, check=False)
        if not out_path.exists():
            raise RuntimeError(f"{part.__name__} exited (code {done.returncode}) without a result")
        ok, value = pickle.loads(out_path.read_bytes())
    if not ok:
        raise RuntimeError(f"{part.__name__} failed in its own process: {value}")
    return value


def warm_start(cfg: Any, out_dir: Path) -> Path:
    from rollart.job.driver import warm_start_checkpoint

    return warm_start_checkpoint(cfg, out_dir)


def trl_arm(cfg: Any, work: Path) -> dict[str, Any]:
    from benchmarks.overhead_trl import run_trl
    from rollart.job.driver import evaluate

    result = run_trl(cfg, work)
    scored = evaluate(cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(result["model"])}),
                                             "run_dir": str(work / "trl-eval")}))
    return {**result, "eval_last": round(scored.scores[DOMAIN], 3)}


def rollart_arm(cfg: Any) -> dict[str, Any]:
    from rollart.base.run_dir import RunPaths
    from rollart.job.driver import train

    sampler = CpuSampler().start()
    try:
        summary = train(cfg)
    finally:
        sampler.stop()
    paths = RunPaths.of(cfg.run_dir)
    records = [json.loads(line) for line in Path(paths.metrics).read_text().splitlines() if line.strip()]
    steps = [r for r in records if "time/step" in r]  # the step records, as written (each at its step's end)
    start, end = steps[0]["time"] - steps[0]["time/step"], steps[-1]["time"]
    rewards = reward_spans_ms(paths.timeline)
    return {
        "rl_wall_s": end - start,
        "cpu_by_role": sampler.by_role(start, end),
        "other_actors": sampler.by_title(start, end, "ray_other_actors"),
        "trajectories": len(steps) * cfg.rollout.batch_size,
        "eval_first": round(summary["eval_first_by_domain"][DOMAIN], 3),
        "eval_last": round(summary["eval_last_by_domain"][DOMAIN], 3),
        "step_s_median": round(statistics.median(r["time/step"] for r in steps), 3),
        "train_s_median": round(statistics.median(r["time/train"] for r in records if "time/train" in r), 3),
        "get_batch_wait_s_median": round(statistics.median(r.get("time/get_batch_wait", 0.0) for r in steps), 3),
        "reward_p50_ms": _percentile(rewards, 50),
        "train_reward": (_mean(r["reward/mean"] for r in steps[:10]), _mean(r["reward/mean"] for r in steps[-10:])),
        "response_tokens": _mean(r["rollout/response_tokens"] / cfg.rollout.batch_size for r in steps
                                 if "rollout/response_tokens" in r),
        "reward_p95_ms": _percentile(rewards, 95),
    }


def reward_spans_ms(timeline: Path) -> list[float]:
    """Each trajectory's time in reward spans on the run's timeline (ms; summed per trajectory: a score passed
    on by the control plane adds a span of its own), ascending."""
    trace = json.loads(Path(timeline).read_text())
    per: dict[str, float] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "trajectory" and e.get("name") == "reward":
            tid = e["args"]["trajectory_id"]
            per[tid] = per.get(tid, 0.0) + e["dur"] / 1000
    return sorted(per.values())


def _mean(values: Any) -> float:
    values = list(values)
    return round(sum(values) / len(values), 3) if values else float("nan")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, round(q / 100 * len(values)) - 1))]
