"""Reading metrics.jsonl back, and the run summary derived from it.

In: RUN_DIR/metrics.jsonl (lines written by `MetricsLogger`). Out: one merged record per step, series of a
metric over steps and wall time, and RUN_DIR/summary.json.

Guarantees:
- Records of the same step are merged (later lines win), so a step logged in several calls, or logged
  again after a resume, reads as one record; the result is ordered by step.
- A malformed line is a ValueError naming the file and line number (a truncated last line — a crash
  mid-write — is skipped, since everything before it is still good).
- summary.json holds at least: steps, wall_s, eval_first, eval_last, eval_first_by_domain,
  eval_last_by_domain (None / {} when the run logged no eval), reward_first, reward_last, trajectories,
  tokens, and the last value of the counters buffer/{aborted, stale, failed, cancelled, wasted_tokens}
  (as `<name>_total`, None if never logged); the driver's own
  `extra` keys are merged over them. It is written atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from rollart.base.run_dir import RunPaths

Record = dict[str, Any]
# counters since the run started (RolloutScheduler.metrics()): their last value is the run's total
COUNTERS = ("aborted", "stale", "failed", "cancelled", "wasted_tokens")


MAX_METRIC = 1e15  # larger than any metric rollart logs (unix times are 1.8e9): a value past it is not one


def read_metrics(path: str | Path) -> list[Record]:
    """The records of a metrics.jsonl merged by step, streamed (never read whole, never through a link); a torn
    last line (a crash while writing it) is skipped, a bad line before it is a `ValueError` naming it. Values
    are what rollart writes — numbers, or null for a non-finite one: anything else a file holds (text, lists,
    booleans, numbers past ±`MAX_METRIC`) reads as null, so the plots only ever meet numbers."""
    path = Path(path)
    by_step: dict[int, Record] = {}
    bad = ""  # a line that did not parse: an error unless it turns out to be the last one
    for number, line in RunPaths.of(path.parent).lines(path):
        if line is not None and not line.strip():
            continue
        if bad:
            raise ValueError(bad)
        try:
            if line is None:
                raise ValueError("a line too long for a metrics record")
            rec = json.loads(line)
            step = int(rec["step"])
            if not -MAX_METRIC <= step <= MAX_METRIC:
                raise ValueError(f"step {step} is out of range")
            by_step.setdefault(step, {}).update({str(k): _metric(v) for k, v in rec.items()}, step=step)
        except (ValueError, KeyError, TypeError, IndexError, OverflowError, RecursionError) as exc:
            shown = "" if line is None else f": {line[:120]!r}"
            bad = f"{path}:{number}: not a metrics record ({str(exc)[:120]}){shown}"
    return [by_step[s] for s in sorted(by_step)]


def _metric(value: Any) -> float | int | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and -MAX_METRIC <= value <= MAX_METRIC:
        return value
    return None


def series(records: list[Record], name: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(x values, metric values) of the records that hold a number for `name`; x is "step" or "wall_s"."""
    xs, ys = [], []
    for rec in records:
        value = rec.get(name)
        if isinstance(value, (int, float)) and isinstance(rec.get(x), (int, float)):
            xs.append(float(rec[x]))
            ys.append(float(value))
    return xs, ys


def domains_with(records: list[Record], prefix: str, suffix: str) -> list[str]:
    """Domains named by keys `<prefix><domain><suffix>`, e.g. ("eval/", "/score") → ["frozenlake", "math"]."""
    found = {
        k[len(prefix): -len(suffix)]
        for rec in records for k in rec
        if k.startswith(prefix) and k.endswith(suffix) and len(k) > len(prefix) + len(suffix)
    }
    return sorted(d for d in found if "/" not in d)


def _first_last(records: list[Record], name: str) -> tuple[float | None, float | None]:
    _, ys = series(records, name)
    return (ys[0], ys[-1]) if ys else (None, None)


def summarize(records: list[Record]) -> dict[str, Any]:
    domains = domains_with(records, "eval/", "/score")
    eval_first, eval_last = _first_last(records, "eval/mean")
    first_by = {d: _first_last(records, f"eval/{d}/score")[0] for d in domains}
    last_by = {d: _first_last(records, f"eval/{d}/score")[1] for d in domains}
    if eval_first is None and domains:  # no eval/mean logged: the mean of the domains
        eval_first = sum(v for v in first_by.values() if v is not None) / len(domains)
        eval_last = sum(v for v in last_by.values() if v is not None) / len(domains)
    reward_first, reward_last = _first_last(records, "rollout/reward_mean")

    def total(name: str) -> float:
        return sum(series(records, name)[1])

    return {
        "steps": max((int(r["step"]) for r in records), default=0),
        "wall_s": max((float(r.get("wall_s") or 0.0) for r in records), default=0.0),
        "eval_first": eval_first,
        "eval_last": eval_last,
        "eval_first_by_domain": first_by,
        "eval_last_by_domain": last_by,
        "reward_first": reward_first,
        "reward_last": reward_last,
        "trajectories": total("rollout/trajectories"),
        "tokens": total("rollout/tokens"),
        **{f"{k}_total": _first_last(records, f"buffer/{k}")[1] for k in COUNTERS},
    }


def write_summary(run_dir: str | Path, extra: Mapping[str, Any] | None = None) -> Path:
    """Summarise RUN_DIR/metrics.jsonl (plus the driver's `extra`) into RUN_DIR/summary.json."""
    paths = RunPaths.of(run_dir)
    records = read_metrics(paths.metrics) if os.path.lexists(paths.metrics) else []
    summary = {**summarize(records), **(extra or {})}
    return paths.write(paths.summary, json.dumps(summary, indent=2, default=str))  # atomically, no link followed
