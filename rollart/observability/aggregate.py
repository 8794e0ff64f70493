"""Per-trajectory records → namespaced metrics for one step. Pure functions.

In: the trajectories of a train batch (and those dropped since the last step), the policy version being
trained, spans, token counts. Out: flat `{"<namespace>/<name>": float}` dicts for `MetricsLogger.log`.

Names produced (every one listed in `rollart/observability/__init__.py`'s docstring):
- `rollout_metrics`: rollout/{trajectories, groups, turns_mean, tokens, prompt_tokens, response_tokens,
  success, reward_mean, truncated_frac, format_error_frac}; env/<domain>/{count, success, reward,
  env_return, turns, tokens, prefill_tokens, decode_tokens} (means per trajectory, count a count), and
  env/<domain>/agent/<name> for each number a user agent returned in its `metrics` (the mean over the
  trajectories that reported it);
  reward/{mean, std, min, max, zero_std_groups}.
- `span_time_totals`: time/<span name> for the phases in `PHASES` (always) and any other span name:
  summed seconds over the batch's trajectories (trajectory-seconds; divide by rollout/trajectories for
  the time one trajectory spent in a phase).
- `staleness_metrics`: buffer/staleness_<k> (trajectories trained k versions after their behaviour
  version), buffer/staleness_mean, buffer/staleness_max.
- `utilisation_metrics`: pools/<pool>/utilisation.   `system_metrics`: system/{tokens_per_s, rss_mb}.
- `prefixed("train", trainer_stats)`: train/<name> (also for reward/ and weights/ stats of other planes).

Definitions: a trajectory succeeded if its `metrics["success"]` (set by the env plane) is truthy, or,
when the env did not say, if its reward (else env return) is > 0. Prefill tokens are
`metrics["prefill_tokens"]` when the inference plane reported them (prefix-cache aware), else the new
prompt tokens of every turn.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Iterable, Literal, Mapping, Sequence

from rollart.observability.utilisation import pool_utilisation
from rollart.types import AGENT_METRIC_PREFIX, DATA_METRIC_PREFIX, Span, Status, Trajectory

AGENT_COUNTERS: tuple[str, ...] = ("malformed_tool_calls", "segments_branched", "choices_dropped")
# The life of a trajectory, in order; the report draws these phases.
# `agent.step` is an agent domain's env.step: the agent's own time between its model calls (tools, logic).
PHASES: tuple[str, ...] = ("env.reset", "generate", "env.step", "agent.step", "reward", "buffer.wait")


def trajectory_spans(traj: Trajectory) -> list[Span]:
    """Every span of a trajectory (its own and its turns'), ordered by start."""
    spans = list(traj.spans) + [s for t in traj.turns for s in t.spans]
    return sorted(spans, key=lambda s: (s.start, -s.end))


def succeeded(traj: Trajectory) -> bool:
    if "success" in traj.metrics:
        return bool(traj.metrics["success"])
    score = traj.reward if traj.reward is not None else traj.env_return
    return score > 0


def _prefill_tokens(traj: Trajectory) -> float:
    if "prefill_tokens" in traj.metrics:
        return float(traj.metrics["prefill_tokens"])
    return float(sum(len(t.prompt_token_ids) for t in traj.turns))


def _reward(traj: Trajectory) -> float:
    return traj.reward if traj.reward is not None else traj.env_return


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def rollout_metrics(batch: Sequence[Trajectory]) -> dict[str, float]:
    if not batch:
        return {"rollout/trajectories": 0.0}
    rewards = [_reward(t) for t in batch]
    turns = [t for tr in batch for t in tr.turns]
    prompt = sum(len(t.prompt_token_ids) for t in turns)
    response = sum(len(t.response_token_ids) for t in turns)
    by_group: dict[str, list[float]] = defaultdict(list)
    for tr in batch:
        by_group[tr.group_id].append(_reward(tr))
    out = {
        "rollout/trajectories": float(len(batch)),
        "rollout/groups": float(len(by_group)),
        "rollout/turns_mean": len(turns) / len(batch),
        "rollout/tokens": float(prompt + response),
        "rollout/prompt_tokens": float(prompt),
        "rollout/response_tokens": float(response),
        "rollout/success": _mean([float(succeeded(t)) for t in batch]),
        "rollout/reward_mean": _mean(rewards),
        "rollout/truncated_frac": _mean([float(t.status == Status.TRUNCATED) for t in batch]),
        "rollout/format_error_frac": _mean([float(not t.format_ok) for t in turns]),
        "reward/mean": _mean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "reward/min": min(rewards),
        "reward/max": max(rewards),
        # groups whose rewards are all equal give GRPO a zero advantage: no learning signal
        "reward/zero_std_groups": _mean([float(len(set(rs)) == 1) for rs in by_group.values()]),
    }
    by_domain: dict[str, list[Trajectory]] = defaultdict(list)
    for tr in batch:
        by_domain[tr.domain].append(tr)
    for domain, trs in sorted(by_domain.items()):
        p = f"env/{domain}/"
        out[p + "count"] = float(len(trs))
        out[p + "success"] = _mean([float(succeeded(t)) for t in trs])
        out[p + "reward"] = _mean([_reward(t) for t in trs])
        out[p + "env_return"] = _mean([t.env_return for t in trs])
        out[p + "turns"] = _mean([float(len(t.turns)) for t in trs])
        out[p + "tokens"] = _mean([float(t.num_tokens) for t in trs])
        out[p + "prefill_tokens"] = _mean([_prefill_tokens(t) for t in trs])
        out[p + "decode_tokens"] = _mean([float(t.num_response_tokens) for t in trs])
        for key in AGENT_COUNTERS:  # agent domains: tool calls that did not parse, history rewrites
            if any(key in t.metrics for t in trs):
                out[p + key] = _mean([float(t.metrics.get(key, 0.0)) for t in trs])
        # a user agent's own metrics and an env's row numbers: the mean over the trajectories that reported each
        reported: dict[str, list[float]] = defaultdict(list)
        for t in trs:
            for key, value in t.metrics.items():
                if key.startswith((AGENT_METRIC_PREFIX, DATA_METRIC_PREFIX)):
                    reported[key].append(float(value))
        for key, values in sorted(reported.items()):
            out[p + key] = _mean(values)
    return out


def span_time_totals(batch: Iterable[Trajectory]) -> dict[str, float]:
    totals: dict[str, float] = {f"time/{p}": 0.0 for p in PHASES}
    for tr in batch:
        for s in trajectory_spans(tr):
            totals[f"time/{s.name}"] = totals.get(f"time/{s.name}", 0.0) + s.duration
    return totals


def staleness_metrics(
    batch: Iterable[Trajectory], train_version: int, mode: Literal["trajectory", "token"] = "trajectory"
) -> dict[str, float]:
    """Histogram of train_version − behaviour version (the trajectory's start version, or in `token`
    mode its oldest generated token's version: the same choice as `rollout.staleness`)."""
    ages: list[int] = []
    for tr in batch:
        behaviour = tr.start_version if mode == "trajectory" else tr.min_token_version
        age = train_version - behaviour
        if age < 0:
            raise ValueError(
                f"trajectory {tr.trajectory_id} has behaviour version {behaviour} newer than the train "
                f"version {train_version}: pass the version being trained"
            )
        ages.append(age)
    out = {f"buffer/staleness_{k}": float(n) for k, n in sorted(Counter(ages).items())}
    out["buffer/staleness_mean"] = _mean([float(a) for a in ages])
    out["buffer/staleness_max"] = float(max(ages, default=0))
    return out


def batch_metrics(
    batch: Sequence[Trajectory], train_version: int, staleness: Literal["trajectory", "token"] = "trajectory"
) -> dict[str, float]:
    """Everything the driver logs about a train batch: rollout/, env/, reward/, time/ phases, staleness."""
    return {
        **rollout_metrics(batch),
        **span_time_totals(batch),
        **staleness_metrics(batch, train_version, staleness),
    }


def utilisation_metrics(
    spans: Iterable[Span], window: tuple[float, float] | None = None, workers: Iterable[str] = ()
) -> dict[str, float]:
    return {f"pools/{p}/utilisation": u for p, u in pool_utilisation(spans, window, workers).items()}


def system_metrics(tokens: float, seconds: float) -> dict[str, float]:
    """Throughput of the step (generated tokens ÷ step seconds) and this process's resident memory."""
    import psutil

    return {
        "system/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "system/rss_mb": psutil.Process().memory_info().rss / 2**20,
    }


def prefixed(namespace: str, stats: Mapping[str, float]) -> dict[str, float]:
    """{"loss": 0.1} → {"train/loss": 0.1}; keys already under the namespace are kept as they are."""
    return {(k if k.startswith(namespace + "/") else f"{namespace}/{k}"): float(v) for k, v in stats.items()}
