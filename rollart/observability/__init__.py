"""rollart.observability: metrics of every plane, the trajectory timeline, live progress and the report.

What the driver does with it, once per run and once per step:

    logger = MetricsLogger(cfg.run_dir, cfg.observability, start_time=t0, hparams=cfg.model_dump(mode="json"),
                           resume_step=first_step if cfg.resume else None)
    timeline = Timeline(start_time=t0, max_trajectories=cfg.observability.timeline_max_trajectories)
    progress = Progress(cfg.observability.progress)
    each step:
        for t in batch + dropped: timeline.add_trajectory(t)
        timeline.add_span(Span("train", t_a, t_b, "trainer/train/0"))           # and weights.*, get_batch.wait
        metrics = {**batch_metrics(batch, version, cfg.rollout.staleness), **scheduler.metrics(),
                   **utilisation_metrics(timeline.window_spans(step_start), (step_start, step_end), workers),
                   **system_metrics(tokens, step_s), **prefixed("train", trainer_stats),
                   "time/train": ..., "time/step": ..., ...}
        logger.log(step, metrics); progress.update(step, total_steps, metrics)
        (eval steps: logger.log(step, {"eval/<d>/score": ..., "eval/mean": ...}) — merged into the step)
    at the end (and every few steps, so a crashed run keeps its timeline):
        if cfg.observability.timeline: timeline.write(RunPaths.of(run_dir))   # rollart.base.run_dir
        write_summary(run_dir, extra); logger.close(); progress.close(); build_report(run_dir)

Metric names (`<d>` = a domain, `<pool>` = a pool, `<k>` = 0, 1, …):
- time/{env.reset, generate, env.step, agent.step, reward, buffer.wait}: trajectory-seconds summed over the batch
  (`batch_metrics`); time/{train, weights.publish, weights.pull, weights.exposed, get_batch_wait, step}:
  wall seconds of the driver's phases (the driver logs them); time/{startup, warm_start}, in the first RL
  step's record only: everything before RL (start-up, warm start, first evaluation), and the warm start.
- rollout/{trajectories, groups, turns_mean, tokens, prompt_tokens, response_tokens, success, reward_mean,
  truncated_frac, format_error_frac}; env/<d>/{count, success, reward, env_return, turns, tokens,
  prefill_tokens, decode_tokens} (+ malformed_tool_calls, segments_branched, choices_dropped and agent/<name>, the
  agent's own returned metrics, for agent domains); env/<d>/{reset_p50_s, reset_p99_s} (over the resets
  since the last step, retries included) and env/<d>/{resets, reset_retries, resets_failed, pool_hits,
  pool_staged_hits, pool_misses} (totals since the run started), from the env workers (`EnvRouter.reset_metrics`);
  reward/{mean, std, min, max, zero_std_groups}.
- eval/<d>/score and eval/mean (the driver logs them at eval steps).
- train/* (trainer stats through `prefixed("train", ...)`); weights/* (publisher stats).
- buffer/staleness_<k>, buffer/staleness_mean, buffer/staleness_max (per batch, `batch_metrics`);
  buffer/{aborted, stale, failed, wasted_tokens, ...} and rollout/{started, completed, running, ...}:
  the control plane's `RolloutScheduler.metrics()`, counters since the run started (the summary and the
  report read their last value); rollout/running_peak is the most trajectories in flight at once so far;
  buffer/cancelled likewise if a plane counts it.
- pools/<pool>/utilisation (`utilisation_metrics`), pools/fallbacks (the resource plane's count).
- system/{tokens_per_s, rss_mb} (`system_metrics`).
- profile/<d>/{turns, prompt_tokens, obs_tokens, response_tokens, prefix_hit, env_s, reward_s}: what each
  domain's episodes look like lately (`DomainProfiler`: the system's, fed every trained batch; the twin's,
  every turn); rollout/remaps and rollout/routed/<d>/<pool>: re-mappings on drift (`rollout.remap`) and where
  each domain's requests were generated; rollout/routed_by_shard/<i>: through which LLM-proxy shard, with
  `inference.proxy_shards` > 1.
"""

from rollart.observability.aggregate import (
    PHASES,
    batch_metrics,
    prefixed,
    rollout_metrics,
    span_time_totals,
    staleness_metrics,
    system_metrics,
    trajectory_spans,
    utilisation_metrics,
)
from rollart.observability.logger import MetricsLogger
from rollart.observability.profile import DomainProfiler
from rollart.observability.progress import Progress
from rollart.observability.records import read_metrics, summarize, write_summary
from rollart.observability.metric_names import NAMESPACES
from rollart.observability.timeline import Timeline, assign_lanes, load_trace
from rollart.observability.utilisation import pool_utilisation, worker_utilisation

__all__ = [
    "NAMESPACES",
    "DomainProfiler",
    "PHASES",
    "MetricsLogger",
    "Progress",
    "Timeline",
    "assign_lanes",
    "batch_metrics",
    "build_report",
    "load_trace",
    "pool_utilisation",
    "prefixed",
    "read_metrics",
    "rollout_metrics",
    "span_time_totals",
    "staleness_metrics",
    "summarize",
    "system_metrics",
    "trajectory_spans",
    "utilisation_metrics",
    "worker_utilisation",
    "write_summary",
]


def __getattr__(name: str):
    # the report pulls in matplotlib (~0.5 s): load it only when `build_report` is asked for (PEP 562)
    if name == "build_report":
        from rollart.observability.report import build_report

        return build_report
    raise AttributeError(f"module 'rollart.observability' has no attribute '{name}'")
