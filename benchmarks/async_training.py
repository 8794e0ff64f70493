"""`rollart bench async`: bounded-staleness asynchronous training (α = 1) vs the synchronous loop.

Both arms run the default job (the one `make demo` runs) through the real driver with the same seed: `async`
= α = 1, no barrier (rollout overlaps training, trajectory-level); `sync` = α = 0, `barrier=batch` (rollout
and training alternate, every trajectory on its own — the paper's Sync+; its Sync also steps the environments
in lock step, `rollout.barrier=turn`, which `rollart bench throughput` runs on the twin). Reported:
- `async_vs_sync_step_time`: mean RL step time of sync ÷ async (the paper: 2.65–4.58× throughput of Sync);
- `async_vs_sync_time_to_score`: wall time for sync ÷ async to first reach the target validation score — the
  highest mean score both arms reach (the paper: 2.05× against Sync+ on Qwen3-32B);
- per arm, the step time's parts: the batch wait, the part of it with no train step in flight
  (`time/get_batch_idle`: the trainer waiting for rollout) and the train step.
Times are from each run's metrics.jsonl (RL steps only: start-up and the warm start are excluded).

The full bench takes ~35–40 min on a loaded 2-core machine, so each arm can run on its own: `--arm async` and
`--arm sync` with the same `--json FILE` add their arm to that file (the arms already in it are kept), and the
ratios come once both are there. Without `--arm`, both arms run one after the other in this process.
`--quick`: 6 steps per arm, a small batch, evaluation every 3 steps. `--steps N`: N RL steps per arm instead.

`--seeds N`: the pair of arms N times, seeds 0 … N−1 (`seed=`), async then sync for each seed, so the machine's
drift reaches both arms of a pair alike; the ratios are the medians of the pairs' ratios, each pair's kept in
the JSON (`seeds`). Time-to-score turns on where each arm first crosses a score in a coarse evaluation grid:
one pair of runs has measured anywhere from 1.30 to 2.46 on this machine, so one seed is one sample.
`--arm` runs one pair's arm (seed 0) and does not combine with `--seeds`.

`--elastic`: a third arm in each pair, `async_elastic` (α = 1 with `train.elastic_generation`: the trainer's rank
generates on its own weights while it waits for a batch), run between async and sync; reported beside the others:
`elastic_vs_async_step_time` (async's mean step ÷ async_elastic's), and in each row the share of the turns
generated on the lent engine (`lent_turn_share`), the turns moved off it per step (`preempted_turns_per_step`),
the shares of the step the devices were lent (`lent_share`) and generating there (`lent_busy_share`), and the part
of the step they were idle waiting for the batch (`device_idle_share`: `get_batch_idle` less the lent engine's
generating time).
On this machine the lent engine runs on the same two cores as everything else, so it can lend no idle device: the
figure says what lending costs or gains where the trainer's devices are not separate.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult
from rollart.base.run_dir import RunPaths
from rollart.config.loader import load_config
from rollart.job.driver import train
from rollart.observability import read_metrics

ARMS = {"async": ["rollout.alpha=1", "rollout.barrier=none"], "sync": ["rollout.alpha=0", "rollout.barrier=batch"]}
ELASTIC = {"async_elastic": [*ARMS["async"], "train.elastic_generation=true"]}  # `--elastic`
ALL_ARMS = {**ARMS, **ELASTIC}


def run_arm(arm: str, quick: bool, steps: int | None = None, seed: int = 0) -> dict[str, Any]:
    """One arm through the real driver: its row and its evaluation curve (seconds from the first evaluation)."""
    extra = (["train.steps=6", "eval.every=3", "eval.episodes_per_domain=8", "train.warm_start.steps=20"]
             if quick else [])
    if steps is not None:
        extra += [f"train.steps={steps}", f"eval.every={max(1, steps // 2)}"]
    extra.append(f"seed={seed}")
    with tempfile.TemporaryDirectory(prefix="rollart-bench-async-") as tmp:
        run_dir = Path(tmp) / arm
        cfg = load_config(None, [f"run_dir={run_dir}", "observability.progress=quiet",
                                 "observability.tensorboard=false", *extra, *ALL_ARMS[arm]])
        train(cfg)
        records = read_metrics(RunPaths.of(run_dir).metrics)
    steps = [r for r in records if "time/step" in r][1:]  # the first waits for the warm-up
    trains = [r["time/train"] for r in records if "time/train" in r][1:]  # (the trainer's records, apart)
    evals = [(r["wall_s"], r["eval/mean"]) for r in records if "eval/mean" in r]
    curve = [(w - evals[0][0], s) for w, s in evals]  # from the first evaluation (RL start)
    mean = lambda key: sum(r.get(key, 0.0) for r in steps) / len(steps)  # noqa: E731
    row = {"arm": arm, "seed": seed, "steps": cfg.train.steps, "mean_step_s": round(mean("time/step"), 3),
           "get_batch_wait_s": round(mean("time/get_batch_wait"), 3),
           "get_batch_idle_s": round(mean("time/get_batch_idle"), 3),
           "get_batch_idle_share": round(mean("time/get_batch_idle") / mean("time/step"), 3),
           "train_step_s": round(sum(trains) / max(len(trains), 1), 3),
           "eval_first": round(evals[0][1], 3), "eval_last": round(evals[-1][1], 3),
           "rl_wall_s": round(curve[-1][0], 1), **_lending(records, steps)}
    return {"row": row, "curve": curve}


def _lending(records: list[dict[str, Any]], steps: list[dict[str, Any]]) -> dict[str, float]:
    """What the lent engine did (nothing for an arm that does not lend): its share of the routed turns by the
    last record, and the turns moved off it per step."""
    last = next((r for r in reversed(records) if any(k.startswith("rollout/routed/") for k in r)), {})
    routed = {k: v for k, v in last.items() if k.startswith("rollout/routed/") and k.count("/") == 3}
    lent = sum(v for k, v in routed.items() if k.endswith("/trainer_lent"))
    if not lent:
        return {}
    mean = lambda key: sum(r.get(key, 0.0) for r in steps) / len(steps)  # noqa: E731
    step = mean("time/step")
    # the devices' idle part of the batch wait: the wait with no train step in flight, less what the lent engine
    # generated meanwhile (the twin's "trainer pool busy", read the other way)
    idle = sum(max(0.0, r.get("time/get_batch_idle", 0.0) - r.get("time/trainer.lent_busy", 0.0)) for r in steps)
    return {"lent_turn_share": round(lent / sum(routed.values()), 3),
            "preempted_turns_per_step": round(mean("train/lent_preempted_turns"), 2),
            "lent_share": round(mean("time/trainer.lent") / step, 3),
            "lent_busy_share": round(mean("time/trainer.lent_busy") / step, 3),
            "device_idle_share": round(idle / len(steps) / step, 3)}


def run(quick: bool, json_path: str | None = None, arm: str | None = None, steps: int | None = None,
        seeds: int = 1, elastic: bool = False) -> BenchResult:
    order = ["async", "async_elastic", "sync"] if elastic else list(ARMS)
    if arm is not None:
        if seeds != 1:
            raise ValueError(f"--arm runs one arm of seed 0; it does not combine with --seeds {seeds} (run "
                             "`rollart bench async --seeds N` for both arms of N seeds)")
        return _one_arm(quick, json_path, arm, steps)
    if seeds == 1:
        arms = {a: run_arm(a, quick, steps) for a in order}
        return BenchResult("async", *_compare(arms), data={"arms": arms})
    pairs = []
    for seed in range(seeds):
        arms = {a: run_arm(a, quick, steps, seed) for a in order}
        ratios, rows, notes = _compare(arms)
        pairs.append({"seed": seed, "ratios": ratios, "rows": rows, "notes": notes, "arms": arms})
    medians: dict[str, float | None] = {}
    for key in pairs[0]["ratios"]:
        values = [p["ratios"][key] for p in pairs if p["ratios"][key] is not None]
        medians[key] = statistics.median(values) if values else None
    notes = [f"medians over {seeds} seeds (each pair: async, then sync)"] + [
        f"seed {p['seed']}: step time {_fmt(p['ratios']['async_vs_sync_step_time'])}, time to score "
        f"{_fmt(p['ratios']['async_vs_sync_time_to_score'])}; {p['notes'][0]}" for p in pairs]
    return BenchResult("async", medians, [r for p in pairs for r in p["rows"]], notes,
                       data={"seeds": [{k: p[k] for k in ("seed", "ratios", "arms")} for p in pairs]})


def _fmt(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}"


def _one_arm(quick: bool, json_path: str | None, arm: str, steps: int | None) -> BenchResult:
    """`--arm`: this arm added to the file's, the ratios once both are there."""
    if arm not in ALL_ARMS:
        raise ValueError(f"--arm {arm!r}: one of {sorted(ALL_ARMS)}")
    if not json_path:
        raise ValueError("--arm needs --json FILE: the file the arms are gathered in")
    arms: dict[str, Any] = {}
    path = Path(json_path)
    if path.exists():
        try:
            kept = json.loads(path.read_text()).get("arms", {})
        except ValueError as exc:
            raise ValueError(f"{json_path}: not a bench async file ({exc})") from None
        arms = {a: v for a, v in kept.items() if a in ALL_ARMS and a != arm}
    arms[arm] = run_arm(arm, quick, steps)
    if not set(ARMS) <= set(arms):
        rows = [arms[a]["row"] for a in ALL_ARMS if a in arms]
        return BenchResult("async", {}, rows, [f"arms so far: {sorted(arms)}; run the others with --arm"],
                           data={"arms": arms})
    return BenchResult("async", *_compare(arms), data={"arms": arms})


def _compare(arms: dict[str, Any]) -> tuple[dict[str, float | None], list[dict[str, Any]], list[str]]:
    """Both arms of one seed (and async_elastic's, if it ran): (the ratios, the rows, a note on the target score
    and when each of the pair reached it)."""
    rows = [arms[a]["row"] for a in ALL_ARMS if a in arms]
    curves = {a: arms[a]["curve"] for a in ARMS}
    by = {r["arm"]: r for r in rows}
    target = min(max(s for _, s in curves[a]) for a in ARMS)
    reach = {a: next(t for t, s in curves[a] if s >= target) for a in ARMS}
    ratios: dict[str, float | None] = {
        "async_vs_sync_step_time": by["sync"]["mean_step_s"] / by["async"]["mean_step_s"],
        "async_vs_sync_time_to_score": reach["sync"] / reach["async"] if reach["async"] > 0 else None,
    }
    if "async_elastic" in by:
        ratios["elastic_vs_async_step_time"] = by["async"]["mean_step_s"] / by["async_elastic"]["mean_step_s"]
    notes = [f"target score {target:.3f} (highest mean validation score both arms reach); time to reach it: "
             f"async {reach['async']:.1f}s, sync {reach['sync']:.1f}s after the first evaluation"]
    return ratios, rows, notes
