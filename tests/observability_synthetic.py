"""A synthetic short run for the observability tests: what the driver will write, without Ray or a model.

`write_synthetic_run(run_dir, steps)` builds batches of multi-turn trajectories in two domains whose spans
overlap on shared workers (continuous batching), plus dropped ones, and drives the observability API the
way the driver does: MetricsLogger (JSONL + TensorBoard), Timeline, summary, with every namespace.
`check_nesting(trace)` asserts the Chrome-trace property the timeline guarantees.
"""

from __future__ import annotations

import random
from collections import defaultdict
import time
from pathlib import Path

from rollart.config import RunConfig
from rollart.config.loader import write_resolved
from rollart.envs.reset_stats import ResetStats
from rollart.observability import (
    DomainProfiler,
    MetricsLogger,
    Timeline,
    batch_metrics,
    prefixed,
    system_metrics,
    utilisation_metrics,
    write_summary,
)
from rollart.observability.samples import SampleLog
from rollart.base.run_dir import RunPaths
from rollart.types import Span, Status, Task, Trajectory, Turn

DOMAINS = {"frozenlake": ("inference/gen_prefill/0", 3), "math": ("inference/gen_decode/0", 1)}
WORKERS = [
    "inference/gen_prefill/0", "inference/gen_decode/0", "env/env/0", "env/env/1",
    "reward/reward/serverless", "trainer/train/0",
]


def make_trajectory(rng: random.Random, tid: str, domain: str, start: float, version: int,
                    status: Status = Status.COMPLETED) -> Trajectory:
    """A trajectory whose spans start at `start`: reset, (generate, step) × turns, reward, buffer wait."""
    gen_worker, max_turns = DOMAINS[domain]
    env_worker = f"env/env/{rng.randrange(2)}"
    t = start
    spans = [Span("env.reset", t, t + 0.05, env_worker)]
    t += 0.05
    turns = []
    for _ in range(rng.randint(1, max_turns)):
        n = rng.randint(2, 6)
        g = Span("generate", t, t + 0.1 + 0.05 * rng.random(), gen_worker)
        # clocks of two processes disagree a little: the step may start just before generate "ended"
        s0 = g.end - (0.002 if rng.random() < 0.2 else 0.0)
        s = Span("env.step", s0, s0 + 0.03, env_worker)
        t = s.end
        turns.append(Turn(
            prompt_token_ids=tuple(range(5)), response_token_ids=tuple(range(n)),
            logprobs=(-0.5,) * n, versions=(version,) * n, spans=(g, s),
        ))
    traj = Trajectory(
        trajectory_id=tid, task=Task(tid, domain, domain, seed=0, group_id=f"{tid[:-2]}"),
        start_version=version, turns=tuple(turns), env_return=float(rng.random() < 0.5), spans=tuple(spans),
    ).finished(status)
    if not status.trainable:
        return traj
    reward = Span("reward", t, t + 0.04, "reward/reward/serverless")
    wait = Span("buffer.wait", reward.end, reward.end + 0.2)  # no worker: the trajectory waits, nobody works
    return traj.scored(traj.env_return, spans=(reward, wait))


def write_synthetic_run(run_dir: Path, steps: int = 4, batch: int = 8, seed: int = 0) -> RunPaths:
    rng = random.Random(seed)
    cfg = RunConfig(run_dir=str(run_dir))
    write_resolved(cfg, run_dir)
    paths = RunPaths.of(run_dir)
    t0 = time.time()
    logger = MetricsLogger(run_dir, cfg.observability, start_time=t0)
    timeline = Timeline(start_time=t0)
    clock = t0 + 1.0
    wasted = 0
    profiler = DomainProfiler()
    samples = SampleLog(paths, 3, decode=lambda ids: " ".join(f"tok{i}" for i in ids), text=logger.text)
    resets = ResetStats()  # what the env workers record and the EnvRouter turns into metrics
    for step in range(1, steps + 1):
        step_start = clock
        version = step - 1
        trajs, dropped = [], []
        for i in range(batch):
            domain = "frozenlake" if i % 2 == 0 else "math"
            start = clock + 0.03 * i
            trajs.append(make_trajectory(rng, f"s{step}-g{i // 2}-{i % 2}", domain, start,
                                         max(0, version - rng.randint(0, 1))))
        dropped.append(make_trajectory(rng, f"s{step}-x-0", "math", clock, version, Status.ABORTED))
        dropped.append(make_trajectory(rng, f"s{step}-x-1", "frozenlake", clock, max(0, version - 1), Status.STALE))
        rollout_end = max(s.end for t in trajs for s in t.spans)
        wait = Span("get_batch.wait", step_start, rollout_end, "control/driver/0")
        publish = Span("weights.publish", rollout_end, rollout_end + 0.05, "trainer/train/0")
        train = Span("train", publish.end, publish.end + 0.3, "trainer/train/0")
        for t in trajs + dropped:
            timeline.add_trajectory(t)
        for t in trajs:
            profiler.observe_trajectory(t)
        for s in (wait, publish, train):
            timeline.add_span(s, step=step)
        clock = train.end
        for t in trajs:
            resets.record(t.task.domain, 0.02 + 0.01 * rng.random(), attempts=1 + (rng.random() < 0.1), ok=True,
                          pool_hit=rng.random() < 0.8 if t.task.domain == "frozenlake" else None)
        tokens = sum(t.num_response_tokens for t in trajs)
        wasted += sum(t.num_response_tokens for t in dropped)
        metrics = {
            **batch_metrics(trajs, version),
            **profiler.metrics(),
            **resets.metrics(),
            # RolloutScheduler.metrics(): counters since the run started
            "buffer/aborted": float(step), "buffer/stale": float(step), "buffer/failed": 0.0,
            "buffer/wasted_tokens": float(wasted),
            **utilisation_metrics(timeline.window_spans(step_start), (step_start, clock), WORKERS),
            **system_metrics(tokens, clock - step_start),
            **prefixed("train", {"loss": 1.0 / step, "grad_norm": 0.5, "lr": 1e-4, "mismatch_kl": 1e-4 / step,
                                 "iw_p01": 0.9, "iw_p50": 1.0, "iw_p99": 1.1, "iw_masked_frac": 0.0}),
            **prefixed("weights", {"bytes": 2.4e6, "buckets": 3}),
            "time/get_batch_wait": wait.duration,
            "time/weights.publish": publish.duration,
            "time/weights.pull": 0.04,
            "time/weights.exposed": 0.01,
            "time/train": train.duration,
            "time/step": clock - step_start,
            "buffer/cancelled": float(step),
            # the resource plane's pool_metrics(): counters since the run started
            "pools/fallbacks": 1.0, "pools/gen_decode/fallbacks_in": 1.0, "pools/gen_prefill/fallbacks_out": 1.0,
        }
        logger.log(step, metrics, at=clock)
        samples.write(step, version, trajs)
        if step == 1 or step % 2 == 0:
            scores = {"frozenlake": 0.1 * step, "math": 0.05 * step}
            logger.log(step, {**{f"eval/{d}/score": v for d, v in scores.items()},
                              "eval/mean": sum(scores.values()) / 2}, at=clock)
    timeline.write(paths)
    write_summary(run_dir, {"completed": True})
    samples.close()
    logger.close()
    return paths


def partial_overlaps(intervals):
    """Pairs of intervals that overlap without one containing the other."""
    bad = []
    for i, (s1, e1) in enumerate(intervals):
        for s2, e2 in intervals[i + 1:]:
            overlap = s1 < e2 and s2 < e1
            nested = (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)
            if overlap and not nested:
                bad.append(((s1, e1), (s2, e2)))
    return bad


def check_nesting(trace) -> int:
    """Assert that within every (pid, tid) complete events nest or are disjoint; returns the thread count."""
    by_thread = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], int) and isinstance(ev["dur"], int) and ev["dur"] >= 0
            by_thread[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
    for ivs in by_thread.values():
        assert partial_overlaps(ivs) == []
    return len(by_thread)
