"""Small pure accumulators behind the reward plane's metrics (`RewardRouter.metrics()`).

- `LatencyWindow`: the last N latencies of one backend → p50/p95 (nearest-rank percentiles).
- `BusyClock`: time during which at least one scoring was in progress (the union of intervals, not their
  sum), over a start time → utilisation of a worker.
- `Timeline`: a step function sampled over time (replicas running) → current, max and time-weighted mean,
  and the integral (replica-seconds, the denominator of the reward pool's utilisation).
All take an injectable clock so tests run without sleeping.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

Clock = Callable[[], float]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of an ascending list; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class LatencyWindow:
    def __init__(self, maxlen: int = 4096) -> None:
        self._values: deque[float] = deque(maxlen=maxlen)
        self.count = 0

    def add(self, seconds: float) -> None:
        self._values.append(seconds)
        self.count += 1

    def summary(self) -> dict[str, float]:
        ordered = sorted(self._values)
        return {"latency_p50_s": percentile(ordered, 50), "latency_p95_s": percentile(ordered, 95)}


class BusyClock:
    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self._active = 0
        self._since = 0.0
        self._busy = 0.0

    def enter(self) -> None:
        if self._active == 0:
            self._since = self.clock()
        self._active += 1

    def exit(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._busy += self.clock() - self._since

    @property
    def busy_s(self) -> float:
        return self._busy + (self.clock() - self._since if self._active else 0.0)

    @property
    def alive_s(self) -> float:
        return self.clock() - self.started

    def utilisation(self) -> float:
        alive = self.alive_s
        return self.busy_s / alive if alive > 0 else 0.0


class Timeline:
    def __init__(self, clock: Clock = time.time, maxlen: int = 10_000) -> None:
        self.clock = clock
        self.points: deque[tuple[float, float]] = deque(maxlen=maxlen)  # (time, value), value changes only
        self._integral = 0.0
        self._start: float | None = None
        self._last_t = 0.0
        self._last_v = 0.0
        self.max = 0.0

    def record(self, value: float) -> None:
        now = self.clock()
        if self._start is None:
            self._start = now
        else:
            self._integral += self._last_v * (now - self._last_t)
        if not self.points or self.points[-1][1] != value:
            self.points.append((now, value))
        self._last_t, self._last_v = now, value
        self.max = max(self.max, value)

    @property
    def current(self) -> float:
        return self._last_v

    def integral(self) -> float:
        """∫ value dt from the first record until now (the last value held since its record)."""
        if self._start is None:
            return 0.0
        return self._integral + self._last_v * (self.clock() - self._last_t)

    def mean(self) -> float:
        if self._start is None:
            return 0.0
        span = self.clock() - self._start
        return self.integral() / span if span > 0 else self._last_v
