"""Worker and pool utilisation from spans: busy time ÷ wall time. Pure functions.

In: `Span`s with `worker` set ("<role>/<pool>/<index>"), an optional window (start, end) in unix seconds,
and optionally the names of workers that exist but may have done nothing (so they count as idle).
Out: utilisation in [0, 1] per worker, and per pool as the mean over the pool's workers.

Guarantees: a worker's busy time is the length of the *union* of its spans clipped to the window, so a
worker that serves several requests at once (continuous batching) is not counted as more than 100% busy;
spans without a worker, and spans named "*.wait" (get_batch.wait, buffer.wait: waiting, not work), are
not busy time. The default window is the first span start to the last span end.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from rollart.types import Span


def worker_pool(worker: str) -> str:
    """The pool of a worker name: the middle part of "<role>/<pool>/<index>"; "<role>/<index>" → role."""
    parts = worker.split("/")
    return parts[1] if len(parts) >= 3 else parts[0]


def union_seconds(intervals: Iterable[tuple[float, float]], window: tuple[float, float]) -> float:
    """Length of the union of intervals, each clipped to `window`."""
    lo, hi = window
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in clipped:
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def is_busy(span: Span) -> bool:
    return bool(span.worker) and not span.name.endswith(".wait")


def span_window(spans: Iterable[Span]) -> tuple[float, float] | None:
    """(first start, last end) of the spans that name a worker, or None if there are none."""
    ends = [(s.start, s.end) for s in spans if is_busy(s)]
    if not ends:
        return None
    return min(s for s, _ in ends), max(e for _, e in ends)


def worker_utilisation(
    spans: Iterable[Span], window: tuple[float, float] | None = None, workers: Iterable[str] = ()
) -> dict[str, float]:
    # a span that ends before it starts (or not at all: NaN) is not a measurement — a crafted timeline holds them
    spans = [s for s in spans if is_busy(s) and s.end >= s.start]
    window = window or span_window(spans)
    if window is None:
        return {w: 0.0 for w in workers}
    if window[1] < window[0]:
        raise ValueError(f"utilisation window ends before it starts: {window}")
    wall = window[1] - window[0]
    by_worker: dict[str, list[tuple[float, float]]] = {w: [] for w in workers}
    for s in spans:
        by_worker.setdefault(s.worker, []).append((s.start, s.end))
    return {w: (union_seconds(iv, window) / wall if wall > 0 else 0.0) for w, iv in sorted(by_worker.items())}


def pool_utilisation(
    spans: Iterable[Span], window: tuple[float, float] | None = None, workers: Iterable[str] = ()
) -> dict[str, float]:
    """Mean utilisation of each pool's workers (every worker seen in the spans or named in `workers`)."""
    per_pool: dict[str, list[float]] = defaultdict(list)
    for worker, u in worker_utilisation(spans, window, workers).items():
        per_pool[worker_pool(worker)].append(u)
    return {pool: sum(us) / len(us) for pool, us in sorted(per_pool.items())}
