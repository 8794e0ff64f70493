"""Per-domain reset statistics: how long resets take, how often they fail, how often the warm pool served.

In: one `record(...)` per trajectory's reset phase, from the `EnvManager` (its latency from the first
try to an observation or to giving up, retries and their backoff included — what a trajectory waits —,
the tries it took, whether it succeeded, and whether a prepared env came from the warm pool).
Out: `drain()` → the records since the last drain as JSON data (what an env worker hands its router);
`add(drained)` merges them into another `ResetStats`; `metrics()` → the step's metrics:
- `env/<domain>/reset_p50_s`, `env/<domain>/reset_p99_s`: over the resets recorded since the last
  `metrics()` call (absent when there were none);
- `env/<domain>/resets`, `reset_retries` (tries past the first), `resets_failed` (out of tries: the
  trajectory ended FAILED), `pool_hits`, `pool_misses`, and `pool_staged_hits` (the hits whose env was staged
  for the reset's seed, its task's files written ahead): totals since the stats were made.

Guarantees: memory is bounded (at most `WINDOW` latencies per domain are kept between two calls); the
totals never go back (a worker's records reach the router once, by drain).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

WINDOW = 4096
COUNTERS = ("resets", "reset_retries", "resets_failed", "pool_hits", "pool_staged_hits", "pool_misses")


def quantile(values: list[float], q: int) -> float:
    """The q-th percentile (1 ≤ q ≤ 99) of values (inclusive method; the value itself for one)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass
class _Domain:
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))


class ResetStats:
    def __init__(self) -> None:
        self._domains: dict[str, _Domain] = {}

    def _domain(self, name: str) -> _Domain:
        return self._domains.setdefault(name, _Domain())

    def record(self, domain: str, seconds: float, attempts: int, ok: bool, pool_hit: bool | None,
               staged: bool = False) -> None:
        """One reset phase; `pool_hit` None when the domain has no warm pool, `staged` when the pool's env was
        staged for the reset's seed (a forecast group)."""
        d = self._domain(domain)
        d.latencies.append(seconds)
        d.counts["resets"] += 1
        d.counts["reset_retries"] += max(attempts - 1, 0)
        d.counts["resets_failed"] += not ok
        if pool_hit is not None:
            d.counts["pool_hits" if pool_hit else "pool_misses"] += 1
            d.counts["pool_staged_hits"] += bool(pool_hit and staged)

    def drain(self) -> dict[str, Any]:
        """The records since the last drain, as JSON data; this object starts afresh."""
        out = {name: {"latencies": list(d.latencies), **d.counts} for name, d in self._domains.items()}
        self._domains = {}
        return out

    def add(self, drained: Mapping[str, Any]) -> None:
        for name, data in drained.items():
            d = self._domain(name)
            d.latencies.extend(float(x) for x in data.get("latencies", ()))
            for key in COUNTERS:
                d.counts[key] += int(data.get(key, 0))

    def metrics(self) -> dict[str, float]:
        """The step's metrics (see the module docstring); the latency window starts afresh."""
        out: dict[str, float] = {}
        for name, d in sorted(self._domains.items()):
            if d.latencies:
                values = sorted(d.latencies)
                out[f"env/{name}/reset_p50_s"] = quantile(values, 50)
                out[f"env/{name}/reset_p99_s"] = quantile(values, 99)
                d.latencies.clear()
            out.update({f"env/{name}/{key}": float(v) for key, v in d.counts.items()})
        return out
