"""Timeline of every trajectory's life, written as Chrome-trace JSON (opens in Perfetto / chrome://tracing).

In: finished `Trajectory`s (their spans and their turns' spans: env.reset, generate, env.step, reward,
buffer.wait, each naming the worker that did it) and the driver's own spans (train, weights.publish,
get_batch.wait, with a worker such as "trainer/train/0"). Out: RUN_DIR/timeline.json in the Chrome
trace-event format, read back by `load_trace` for the report's Gantt charts and utilisation.

Layout of the trace:
- process "trajectories": one thread per trajectory, an enclosing "trajectory" event (args: id, domain,
  status, reward, start version) with the trajectory's spans nested inside;
- one process per worker pool ("<role>/<pool>/<i>" → pool), one thread per worker, every span that worker
  did (args: trajectory id, domain). A worker that runs several requests at once (continuous batching)
  gets extra lanes "<worker> #2", "#3", … — one per concurrent request — rather than overlapping events;
- marks: global instant events (category "fault": a line across every track in Perfetto) for what
  happened to the run's machinery at one moment — a worker died, a replacement joined, the trainer was
  rebuilt — with the worker and a detail (args).

Guarantees: within every thread, events either nest or are disjoint — never a partial overlap — because
`assign_lanes` moves a span that would partially overlap into another lane; durations are ≥ 0 (a span
whose clocks disagree is drawn with zero length); times are whole microseconds since the run's start. After
`max_trajectories` trajectories, later ones are counted (otherData.dropped_trajectories), not recorded, and
otherData.capped_at_s says from when on the trace misses them (the earliest start of a dropped one), so a
chart drawn from it can say where it stops being complete.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from rollart.observability.aggregate import trajectory_spans
from rollart.observability.utilisation import worker_pool
from rollart.base.run_dir import RunPaths
from rollart.types import Span, Trajectory

TRAJECTORY_PROCESS = "trajectories"
MARK_CATEGORY = "fault"


def assign_lanes(intervals: Sequence[tuple[float, float]]) -> list[int]:
    """A lane per interval (in input order) such that within a lane intervals nest or are disjoint.

    Greedy in start order (longer first on ties): an interval joins the first lane whose innermost open
    interval contains it, or in which it starts after everything has ended.
    """
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    stacks: list[list[float]] = []  # per lane: ends of the open intervals, innermost last
    lanes = [0] * len(intervals)
    for i in order:
        s, e = intervals[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lanes[i] = lane
                break
        else:
            stacks.append([e])
            lanes[i] = len(stacks) - 1
    return lanes


@dataclass(frozen=True)
class _TrajectoryLife:
    trajectory_id: str
    domain: str
    status: str
    reward: float | None
    start_version: int
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class Mark:
    """One moment in the run's life outside any span: `name` (e.g. "worker died"), when, who, why."""

    name: str
    time: float
    worker: str = ""
    detail: str = ""


@dataclass(frozen=True)
class _LooseSpan:
    span: Span
    args: Mapping[str, Any] = field(default_factory=dict)


class Timeline:
    """Collects spans during a run; `write(path)` renders the Chrome trace (call it at any time)."""

    def __init__(self, start_time: float | None = None, max_trajectories: int = 5000) -> None:
        self.start_time = time.time() if start_time is None else float(start_time)
        self.max_trajectories = max_trajectories
        self.dropped_trajectories = 0
        self._capped_from: float | None = None  # unix time: the earliest start of a dropped trajectory
        self._lives: list[_TrajectoryLife] = []
        self._loose: list[_LooseSpan] = []
        self._marks: list[Mark] = []
        self._recent: list[Span] = []  # for per-step utilisation, past the cap too (see window_spans)

    def add_trajectory(self, traj: Trajectory) -> None:
        """Record a finished (or dropped) trajectory's life; only its spans and labels are kept."""
        spans = trajectory_spans(traj)
        self._recent.extend(spans)
        if len(self._lives) >= self.max_trajectories:
            self.dropped_trajectories += 1
            if spans:
                start = min(s.start for s in spans)
                self._capped_from = start if self._capped_from is None else min(self._capped_from, start)
            return
        self._lives.append(
            _TrajectoryLife(
                trajectory_id=traj.trajectory_id,
                domain=traj.domain,
                status=traj.status.value if traj.status else "running",
                reward=traj.reward,
                start_version=traj.start_version,
                spans=tuple(spans),
            )
        )

    def add_span(self, span: Span, **args: Any) -> None:
        """Record a span outside any trajectory (train step, weight sync, get_batch wait) with its worker."""
        if not span.worker:
            raise ValueError(f"span '{span.name}' needs a worker (e.g. 'trainer/train/0') to be placed")
        self._loose.append(_LooseSpan(span, args))
        self._recent.append(span)

    def add_mark(self, mark: Mark) -> None:
        """Record a moment (a fault, a replacement) shown as a line across the timeline and the Gantt charts."""
        self._marks.append(mark)

    def window_spans(self, start: float) -> list[Span]:
        """The spans added so far that end after `start` (beyond the cap too), for the utilisation of
        the window beginning at `start`. Spans that ended before `start` are forgotten here, so memory
        stays bounded: call it with non-decreasing `start` (each step's start)."""
        self._recent = [s for s in self._recent if s.end > start]
        return list(self._recent)

    def write(self, paths: RunPaths) -> Path:
        """Write the run's timeline.json atomically (a reader never sees half a file; a link is replaced,
        never followed)."""
        return paths.write(paths.timeline, json.dumps(self.trace()))

    def trace(self) -> dict[str, Any]:
        return chrome_trace(self._lives, self._loose, self.start_time, self.dropped_trajectories, self._marks,
                            self._capped_from)


def chrome_trace(
    lives: Sequence[_TrajectoryLife], loose: Sequence[_LooseSpan], t0: float, dropped: int = 0,
    marks: Sequence[Mark] = (), capped_from: float | None = None,
) -> dict[str, Any]:
    """The Chrome trace-event JSON object for the given trajectory lives, loose spans and marks."""
    events: list[dict[str, Any]] = []
    tids = itertools.count(1)

    def us(t: float) -> int:
        # whole microseconds: rounding is monotonic, so nesting and disjointness survive it exactly
        return round((t - t0) * 1e6)

    def meta(kind: str, pid: int, name: str, tid: int | None = None, sort: int | None = None) -> None:
        ev: dict[str, Any] = {"ph": "M", "name": kind, "pid": pid, "args": {"name": name}}
        if tid is not None:
            ev["tid"] = tid
        events.append(ev)
        if sort is not None:
            key = "thread_sort_index" if tid is not None else "process_sort_index"
            events.append({**ev, "name": key, "args": {"sort_index": sort}})

    def x(name: str, cat: str, start: float, end: float, pid: int, tid: int, args: Mapping[str, Any]) -> None:
        ts = us(start)
        events.append({
            "ph": "X", "name": name, "cat": cat, "ts": ts, "dur": max(0, us(end) - ts),
            "pid": pid, "tid": tid, "args": dict(args),
        })

    # worker view: spans grouped by worker, from trajectories and from the driver
    by_worker: dict[str, list[tuple[Span, dict[str, Any]]]] = {}
    for life in lives:
        for s in life.spans:
            if s.worker:
                args = {"trajectory_id": life.trajectory_id, "domain": life.domain, "worker": s.worker}
                by_worker.setdefault(s.worker, []).append((s, args))
    for ls in loose:
        by_worker.setdefault(ls.span.worker, []).append((ls.span, {"worker": ls.span.worker, **ls.args}))

    meta("process_name", 1, TRAJECTORY_PROCESS, sort=0)
    for order, life in enumerate(sorted(lives, key=lambda lf: lf.spans[0].start if lf.spans else t0)):
        if not life.spans:
            continue
        label = {"trajectory_id": life.trajectory_id, "domain": life.domain}
        outer = Span("trajectory", min(s.start for s in life.spans), max(max(s.end, s.start) for s in life.spans))
        items = [(outer, {**label, "status": life.status, "reward": life.reward,
                          "start_version": life.start_version})]
        items += [(s, {**label, "worker": s.worker}) for s in life.spans]
        lanes = assign_lanes([(s.start, max(s.end, s.start)) for s, _ in items])
        lane_tid = {}
        for lane in sorted(set(lanes)):
            lane_tid[lane] = next(tids)
            suffix = f" #{lane + 1}" if lane else ""
            meta("thread_name", 1, f"{life.trajectory_id} [{life.domain}]{suffix}", lane_tid[lane], order)
        for (s, args), lane in zip(items, lanes):
            x(s.name, "trajectory", s.start, s.end, 1, lane_tid[lane], args)

    pools = sorted({worker_pool(w) for w in by_worker})
    pool_pid = {p: i + 2 for i, p in enumerate(pools)}
    for p, pid in pool_pid.items():
        meta("process_name", pid, f"pool {p}", sort=pid)
    for w_order, (worker, items) in enumerate(sorted(by_worker.items())):
        pid = pool_pid[worker_pool(worker)]
        lanes = assign_lanes([(s.start, max(s.end, s.start)) for s, _ in items])
        lane_tid = {}
        for lane in sorted(set(lanes)):
            lane_tid[lane] = next(tids)
            meta("thread_name", pid, worker + (f" #{lane + 1}" if lane else ""), lane_tid[lane],
                 w_order * 10_000 + lane)
        for (s, args), lane in zip(items, lanes):
            x(s.name, "worker", s.start, s.end, pid, lane_tid[lane], args)

    for mark in marks:
        events.append({"ph": "i", "s": "g", "name": mark.name, "cat": MARK_CATEGORY, "ts": us(mark.time),
                       "pid": 0, "tid": 0, "args": {"worker": mark.worker, "detail": mark.detail}})

    ends = [s.end for life in lives for s in life.spans] + [ls.span.end for ls in loose] + [m.time for m in marks]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "rollart",
            "t0_unix": t0,
            "end_unix": max(ends, default=t0),
            "trajectories": len(lives),
            "dropped_trajectories": dropped,
            "capped_at_s": None if capped_from is None else capped_from - t0,
        },
    }


# --- reading back (the report) ------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceSpan:
    """One complete event of a trace, in seconds since the run's start."""

    view: str  # "trajectory" or "worker"
    name: str
    start: float
    end: float
    worker: str = ""
    trajectory_id: str = ""
    domain: str = ""
    status: str = ""  # on "trajectory" events: how the trajectory ended


@dataclass(frozen=True)
class Trace:
    spans: tuple[TraceSpan, ...]
    meta: Mapping[str, Any]
    marks: tuple[Mark, ...] = ()  # times in seconds since the run's start

    @property
    def capped_at(self) -> float | None:
        """Seconds since the run's start from which trajectories are missing (the trace cap), or None."""
        value = self.meta.get("capped_at_s")
        return None if value is None else float(value)

    @property
    def end(self) -> float | None:
        """Seconds since the run's start of the last thing the trace holds (None for an old trace)."""
        if "end_unix" not in self.meta or "t0_unix" not in self.meta:
            return None
        return float(self.meta["end_unix"]) - float(self.meta["t0_unix"])

    def worker_spans(self) -> list[Span]:
        """The worker view as `Span`s (seconds since the run's start), for `pool_utilisation`."""
        return [Span(s.name, s.start, s.end, s.worker) for s in self.spans if s.view == "worker"]


def load_trace(path: str | Path) -> Trace:
    """Read a timeline.json written by `Timeline.write`; ValueError naming the file if it is not one. The file
    is anyone's: every field is checked for its type here (times finite numbers, names text), so the plots
    and the report never meet a surprise."""
    path = Path(path)
    try:
        data = json.loads(RunPaths.of(path.parent).read_text(path))  # never through a link, at most 512 MiB
        spans, marks = [], []
        for ev in data["traceEvents"]:
            if not isinstance(ev, dict) or ev.get("ph") not in ("i", "X"):
                continue
            args = ev.get("args") or {}
            start = _seconds(ev["ts"])
            if ev["ph"] == "i" and ev.get("cat") == MARK_CATEGORY:
                marks.append(Mark(str(ev["name"]), start, str(args.get("worker", "")), str(args.get("detail", ""))))
            elif ev["ph"] == "X":
                spans.append(TraceSpan(
                    view=str(ev.get("cat", "")), name=str(ev["name"]), start=start,
                    end=start + _seconds(ev.get("dur", 0)), worker=str(args.get("worker", "")),
                    trajectory_id=str(args.get("trajectory_id", "")), domain=str(args.get("domain", "")),
                    status=str(args.get("status", "")),
                ))
        other = data.get("otherData") or {}
        meta = {k: v for k, v in other.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"{path} is not a Chrome trace written by rollart ({str(exc)[:200]})") from None
    return Trace(tuple(spans), meta, tuple(sorted(marks, key=lambda m: m.time)))


def _seconds(microseconds: Any) -> float:
    if isinstance(microseconds, bool) or not isinstance(microseconds, (int, float)) or not math.isfinite(microseconds):
        raise ValueError(f"a time of {str(microseconds)[:40]!r} µs")
    return microseconds / 1e6
