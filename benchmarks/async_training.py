"""`rollart bench async`: bounded-staleness asynchronous training (α = 1) vs the synchronous loop.

Both arms run the default job (the one `make demo` runs) through the real driver, one after the other in
this process, with the same seed: `async` = α = 1, no barrier (rollout overlaps training, trajectory-level);
`sync` = α = 0, `barrier=batch` (rollout and training alternate — the paper's Sync baseline). Reported:
- `async_vs_sync_step_time`: mean RL step time of sync ÷ async (the paper: 2.65–4.58× throughput of Sync);
- `async_vs_sync_time_to_score`: wall time for sync ÷ async to first reach the target validation score — the
  highest mean score both arms reach (the paper: 2.05× against Sync+ on Qwen3-32B).
Times are from each run's metrics.jsonl (RL steps only: start-up and the warm start are excluded).
`--quick`: 6 steps per arm, a small batch, evaluation every 3 steps. `--steps N`: N RL steps per arm instead.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import BenchResult
from rollart.config.loader import load_config
from rollart.job.driver import train
from rollart.observability import read_metrics
from rollart.base.run_dir import RunPaths

ARMS = {"async": ["rollout.alpha=1", "rollout.barrier=none"], "sync": ["rollout.alpha=0", "rollout.barrier=batch"]}


def run(quick: bool, steps: int | None = None) -> BenchResult:
    extra = (["train.steps=6", "eval.every=3", "eval.episodes_per_domain=8", "train.warm_start.steps=20"]
             if quick else [])
    if steps is not None:
        extra += [f"train.steps={steps}", f"eval.every={max(1, steps // 2)}"]
    rows, curves = [], {}
    with tempfile.TemporaryDirectory(prefix="rollart-bench-async-") as tmp:
        for arm, overrides in ARMS.items():
            run_dir = Path(tmp) / arm
            cfg = load_config(None, [f"run_dir={run_dir}", "observability.progress=quiet",
                                     "observability.tensorboard=false", *extra, *overrides])
            train(cfg)
            records = read_metrics(RunPaths.of(run_dir).metrics)
            step_times = [r["time/step"] for r in records if "time/step" in r][1:]  # the first waits for warm-up
            evals = [(r["wall_s"], r["eval/mean"]) for r in records if "eval/mean" in r]
            curves[arm] = [(w - evals[0][0], s) for w, s in evals]  # from the first evaluation (RL start)
            rows.append({"arm": arm, "steps": cfg.train.steps, "mean_step_s": round(sum(step_times) / len(step_times), 3),
                         "eval_first": round(evals[0][1], 3), "eval_last": round(evals[-1][1], 3),
                         "rl_wall_s": round(curves[arm][-1][0], 1)})
    by = {r["arm"]: r for r in rows}
    target = min(max(s for _, s in curves[a]) for a in ARMS)
    reach = {a: next(t for t, s in curves[a] if s >= target) for a in ARMS}
    ratios = {
        "async_vs_sync_step_time": by["sync"]["mean_step_s"] / by["async"]["mean_step_s"],
        "async_vs_sync_time_to_score": reach["sync"] / reach["async"] if reach["async"] > 0 else float("nan"),
    }
    notes = [f"target score {target:.3f} (highest mean validation score both arms reach); time to reach it: "
             f"async {reach['async']:.1f}s, sync {reach['sync']:.1f}s after the first evaluation"]
    return BenchResult("async", ratios, rows, notes)
