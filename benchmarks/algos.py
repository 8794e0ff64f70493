"""`rollart bench algos`: every registered algorithm (`train.algorithm`) on the default job, over seeds —
resumable, one algorithm × seed per piece.

The job: the default job (`make demo`: frozenlake + math, α = 1, batches of 36, 300 RL steps, an evaluation every
50 steps on 64 greedy episodes per domain), each run starting RL from one warm-started base (the default job's
100-step warm start, built once and cached under the work directory, as `rollart bench staleness` does: a shared
start removes the warm start's variance and time from the comparison). Only `train.algorithm=<name>` differs
(its preset; `rollart/config/algorithm.py`). Seeds 0, 1, 2.

Per piece (`--piece NAME/SEED`, or `--piece next`: the first missing one, algorithm by algorithm) the run goes
through the real CLI in a subprocess while holding the study's lock (`--lock`, as in `bench staleness`: by
default `heavy.lock` in the work directory; a machine-wide heavy-job lock with `--lock PATH`), and
its record is appended to the `--json` file, whose summary is rebuilt from every record so far; `--report` only
rebuilds it. `--quick`: grpo, dapo and ppo, one seed, 10 RL steps, 8 episodes per domain — a smoke run for
`make bench-smoke`, into `--json` if given.

Per algorithm (over seeds): final validation score (mean ± std) and its gain over the first evaluation
(the issue's bar: a mean gain ≥ +0.2), time-to-score (RL wall seconds and steps until the seed-mean curve first
reaches 90% of grpo's mean final score), generated tokens per second of RL wall time (`rollout/tokens` summed over
the steps ÷ RL wall), the fraction of complete groups the group filter dropped (dynamic sampling:
`rollout/groups_filtered` ÷ (that + `rollout/groups_completed`)), the engine-vs-trainer mismatch KL (`train/mismatch_kl`, mean over steps) and the trainer's step time
(`time/train`, and `time/critic` for ppo). Wall times on a shared machine are noisy: prefer the score verdicts.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, machine_info
from benchmarks.staleness import _std, collapsed, ensure_base, heavy_lock
from rollart.algo import ALGORITHMS
from rollart.base.run_dir import RunPaths
from rollart.observability import read_metrics

SEEDS = (0, 1, 2)
QUICK = {"algorithms": ("grpo", "dapo", "ppo"), "steps": 10, "every": 5, "episodes": 8}
TARGET_FRACTION = 0.9  # time-to-score target: this fraction of grpo's mean final score
LEARNS = 0.2  # the bar: mean gain over the seeds
PIECE_TIMEOUT_S = 1800


def run(quick: bool, piece: str | None = None, report: bool = False, json_path: str | None = None,
        workdir: str = "runs/bench-algos", lock: str | None = None) -> BenchResult:
    """`--quick`, one `--piece`, or `--report` (module docstring); returns the study's summary so far."""
    work = Path(workdir)
    if lock is None:
        work.mkdir(parents=True, exist_ok=True)
        lock = str(work / "heavy.lock")
    if quick:
        return summarize([run_piece(name, 0, work, lock, quick=True) for name in QUICK["algorithms"]], quick=True)
    if json_path is None:
        raise ValueError("rollart bench algos needs --json PATH (the study's file: pieces are appended to it)")
    path = Path(json_path)
    records = load_records(path)
    if piece is not None:
        name, seed = choose_piece(piece, records)
        if name is None:
            print("every algorithm × seed of the study is done; nothing to run")
        else:
            print(f"algos piece {name} seed {seed} ({len(records)} of {len(ALGORITHMS) * len(SEEDS)} done)",
                  flush=True)
            records.append(run_piece(name, seed, work, lock, quick=False))
    elif not report:
        raise ValueError("rollart bench algos: give --piece NAME/SEED|next (run one piece), --report, or --quick")
    return summarize(records, quick=False)


def choose_piece(piece: str, records: list[dict[str, Any]]) -> tuple[str | None, int]:
    done = {(r["algorithm"], r["seed"]) for r in records}
    if piece == "next":
        for name in ALGORITHMS:  # algorithm by algorithm, every seed: a partial study has whole rows
            for seed in SEEDS:
                if (name, seed) not in done:
                    return name, seed
        return None, -1
    name, _, seed_text = piece.partition("/")
    if name not in ALGORITHMS or not seed_text.isdigit():
        raise ValueError(f"--piece {piece!r}: give NAME/SEED (NAME one of {', '.join(ALGORITHMS)}; SEED an integer) "
                         "or 'next'")
    if (name, int(seed_text)) in done:
        raise ValueError(f"--piece {piece}: already in the study file; delete its record to run it again")
    return name, int(seed_text)


def run_piece(name: str, seed: int, work: Path, lock: str, quick: bool) -> dict[str, Any]:
    overrides = [f"train.algorithm={name}"]
    if quick:
        overrides += [f"train.steps={QUICK['steps']}", f"eval.every={QUICK['every']}",
                      f"eval.episodes_per_domain={QUICK['episodes']}"]
    with heavy_lock(lock):
        base = ensure_base(work)
        run_dir = work / ("quick" if quick else "study") / f"{name}-seed{seed}"
        if run_dir.exists():  # a piece that died half-way starts over (its record was never written)
            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "rollart.cli", "train", f"run_dir={run_dir}", f"seed={seed}",
               f"model.path={base}", "train.warm_start.steps=0", "observability.progress=plain",
               "observability.tensorboard=false", *overrides]
        started = time.time()
        load_before = os.getloadavg()[0]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIECE_TIMEOUT_S,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode != 0:
            raise RuntimeError(f"piece {name}/seed {seed} failed ({proc.returncode}); its run is in {run_dir}:\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {"algorithm": name, "seed": seed, **read_run(run_dir), "piece_wall_s": round(time.time() - started, 1),
            "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "overrides": overrides}


def read_run(run_dir: Path) -> dict[str, Any]:
    """A finished run's eval curve (step, seconds since RL start, mean score) and what the algorithm measured."""
    metrics = RunPaths.of(run_dir).metrics
    records = read_metrics(metrics)
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    evals = [(int(r["step"]), float(r["wall_s"]), float(r["eval/mean"])) for r in lines if "eval/mean" in r]
    if not evals:
        raise RuntimeError(f"{metrics}: no evaluation in it")
    t0 = evals[0][1]
    steps = [r for r in records if "train/loss" in r]
    last = max((r for r in records if "rollout/groups_completed" in r), key=lambda r: r["step"])
    filtered = float(last.get("rollout/groups_filtered", 0.0))
    generated = sum(float(r.get("rollout/tokens", 0.0)) for r in records)
    rl_wall = evals[-1][1] - t0

    def mean(key: str) -> float | None:
        values = [float(r[key]) for r in steps if key in r]
        return significant(statistics.fmean(values)) if values else None

    return {
        "curve": [[s, round(w - t0, 2), round(v, 4)] for s, w, v in evals],
        "first": round(evals[0][2], 4), "final": round(evals[-1][2], 4),
        "steps": len(steps),
        "tokens_per_s": round(generated / rl_wall, 1) if rl_wall > 0 else None,
        "groups_filtered_frac": round(filtered / max(filtered + float(last["rollout/groups_completed"]), 1.0), 4),
        "mismatch_kl": mean("train/mismatch_kl"), "behaviour_kl": mean("train/behaviour_kl"),
        "train_s": mean("time/train"), "critic_s": mean("time/critic"),
    }


def load_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    if data.get("bench") != "algos" or "runs" not in data:
        raise ValueError(f"{path} is not an algos study file (no bench=algos with runs)")
    return list(data["runs"])


def summarize(records: list[dict[str, Any]], quick: bool) -> BenchResult:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_name.setdefault(r["algorithm"], []).append(r)
    rows = [row(name, sorted(runs, key=lambda r: r["seed"])) for name, runs in by_name.items()]
    rows.sort(key=lambda r: list(ALGORITHMS).index(r["algorithm"]) if r["algorithm"] in ALGORITHMS else 99)
    by = {r["algorithm"]: r for r in rows}
    steps = QUICK["steps"] if quick else 300
    notes = [f"{'quick: ' if quick else ''}the default job ({steps} RL steps) from one shared warm-started base; "
             "eval = greedy mean score over frozenlake and math; only train.algorithm differs",
             f"learns: mean gain over the seeds ≥ +{LEARNS} (the issue's bar)",
             "wall times and tokens/s come from a shared 2-core machine: prefer the score verdicts"]
    ratios: dict[str, float] = {}
    if "grpo" in by:
        target = round(TARGET_FRACTION * by["grpo"]["final_mean"], 4)
        notes.append(f"time-to-score target: {TARGET_FRACTION:.0%} of grpo's mean final score = {target}")
        for r in rows:
            r["target"] = target
            r["time_to_score_s"], r["steps_to_score"] = time_to_score(r, target)
            if by["grpo"]["final_mean"] > 0:
                ratios[f"final_score_{r['algorithm']}_vs_grpo"] = round(r["final_mean"] / by["grpo"]["final_mean"], 4)
    result = BenchResult("algos", ratios, rows, notes)
    done = {(r["algorithm"], r["seed"]) for r in records}
    result.data = {"runs": records,
                   "missing": [] if quick else [f"{a}/{s}" for a in ALGORITHMS for s in SEEDS if (a, s) not in done],
                   "study": {"steps": steps, "seeds": list(SEEDS), "algorithms": list(ALGORITHMS),
                             "machine_at_summary": machine_info()}}
    return result


def row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± std over seeds (the curve at the eval steps every seed has)."""
    steps = sorted(set.intersection(*({p[0] for p in r["curve"]} for r in runs)))
    at = [{p[0]: p for p in r["curve"]} for r in runs]
    gains = [r["final"] - r["first"] for r in runs]

    def mean_of(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return significant(statistics.fmean(values)) if values else None

    return {
        "algorithm": name, "seeds": [r["seed"] for r in runs],
        "first_mean": round(statistics.fmean(r["first"] for r in runs), 4),
        "final_mean": round(statistics.fmean(r["final"] for r in runs), 4),
        "final_std": round(_std([r["final"] for r in runs]), 4),
        "gain_mean": round(statistics.fmean(gains), 4), "gains": [round(g, 4) for g in gains],
        "learns": statistics.fmean(gains) >= LEARNS,
        "curve_steps": steps,
        "curve_mean": [round(statistics.fmean(a[s][2] for a in at), 4) for s in steps],
        "curve_wall_mean": [round(statistics.fmean(a[s][1] for a in at), 1) for s in steps],
        "tokens_per_s": mean_of("tokens_per_s"), "groups_filtered_frac": mean_of("groups_filtered_frac"),
        "mismatch_kl": mean_of("mismatch_kl"), "behaviour_kl": mean_of("behaviour_kl"),
        "train_s": mean_of("train_s"), "critic_s": mean_of("critic_s"),
        "collapsed_seeds": [r["seed"] for r in runs if collapsed(r["curve"])],
    }


def significant(x: float) -> float:
    """Four significant digits (a KL of 3e-9 stays 3e-9, not 0)."""
    return float(f"{x:.4g}")


def time_to_score(r: dict[str, Any], target: float) -> tuple[float | None, int | None]:
    for step, score, wall in zip(r["curve_steps"], r["curve_mean"], r["curve_wall_mean"]):
        if score >= target:
            return wall, step
    return None, None
