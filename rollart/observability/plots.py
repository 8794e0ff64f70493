"""The report's plots, each drawn with matplotlib's object API (no pyplot state, Agg canvas) into PNG bytes.

In: merged metric records (`records.read_metrics`) and a loaded trace (`timeline.load_trace`). Out: PNG
bytes, or None when the input holds nothing to draw (the report then says what is missing).

Guarantees: pure functions of their inputs (no global matplotlib state, safe in threads); colours of the
phases are fixed and distinct (`PHASE_COLOURS`) so every chart of a report and every report agree; axes
hold every bar drawn (nothing is clipped at the y-limit) and legends sit outside the data they describe;
noisy per-step curves (training reward, success) are drawn faint with a moving mean over them. Every text
of a chart is drawn as plain text (`to_png` turns matplotlib's mathtext off): a label comes from a metric
name, which the run directory's files hold — `$\\frac{a}$` there is shown, not parsed (it failed the report).
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from typing import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text

from rollart.observability.aggregate import PHASES
from rollart.observability.records import Record, domains_with, series
from rollart.observability.timeline import Mark, Trace, TraceSpan

PHASE_COLOURS: dict[str, str] = {
    "env.reset": "#8c564b",
    "generate": "#1f77b4",
    "generate.wait": "#9ecae1",  # queued for generation: a pale shade of generate's blue
    "env.step": "#ff7f0e",
    "agent.step": "#dbdb8d",
    "reward": "#2ca02c",
    "buffer.wait": "#c7c7c7",
    "train": "#d62728",
    "weights.exposed": "#9467bd",
    "weights.sync": "#9467bd",
    "weights.publish": "#c5b0d5",
    "weights.pull": "#e377c2",
    "get_batch.wait": "#7f7f7f",
    "get_batch_wait": "#7f7f7f",
    "warm_start": "#393b79",
    "other": "#bcbd22",
    "trajectory": "#f0f0f0",
}
_EXTRA = ("#17becf", "#ffbb78", "#98df8a", "#ff9896", "#f7b6d2", "#dadaeb")  # none of the above
MARK_COLOURS = {"worker died": "#d62728", "node lost": "#d62728", "trainer rebuilt": "#ff7f0e"}
MARK_DEFAULT_COLOUR = "#2ca02c"  # replacements, joins: things getting better


def colour(name: str) -> str:
    return PHASE_COLOURS.get(name) or _EXTRA[sum(map(ord, name)) % len(_EXTRA)]


def to_png(fig: Figure) -> bytes:
    for text in fig.findobj(Text):  # labels are data (metric names): never mathtext
        text.set_parse_math(False)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    except (ValueError, TypeError, OverflowError):
        # a crafted run directory can put a label at an absurd coordinate: the tight box would span millions of
        # pixels (matplotlib refuses) — the figure's own size then, the outlier clipped; and if even that cannot
        # be drawn, no image (b"": the report says the chart is missing, it never fails)
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format="png", dpi=100)
        except (ValueError, TypeError, OverflowError):
            return b""
    return buf.getvalue()


def moving_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value's centred window of `window` values (shorter at the ends)."""
    half = window // 2
    return [sum(values[max(0, i - half): i + half + 1]) / len(values[max(0, i - half): i + half + 1])
            for i in range(len(values))]


def smoothing_window(points: int) -> int:
    """Steps a noisy curve of `points` steps is averaged over: about a tenth of them, odd, 1 for short runs."""
    return 1 if points < 8 else min(51, (points // 10) | 1)


def curves_png(records: list[Record], metrics: Sequence[tuple[str, str]], ylabel: str,
               smooth: bool = False) -> bytes | None:
    """Each (label, metric name) over steps (left) and over wall time (right); None if none has data. With
    `smooth`, each curve per step is drawn faint and its moving mean bold over it (`smoothing_window`)."""
    lines = [(label, name) for label, name in metrics if series(records, name)[1]]
    if not lines:
        return None
    fig = Figure(figsize=(11, 3.6))
    window = 1
    for i, x in enumerate(("step", "wall_s")):
        ax = fig.add_subplot(1, 2, i + 1)
        for k, (label, name) in enumerate(lines):
            xs, ys = series(records, name, x)
            shade = f"C{k}"
            window = smoothing_window(len(ys)) if smooth else 1
            if window > 1:
                ax.plot(xs, ys, color=shade, alpha=0.25, linewidth=0.8)
                ax.plot(xs, moving_mean(ys, window), color=shade, linewidth=2.0, label=label)
            else:
                ax.plot(xs, ys, color=shade, marker="o" if len(xs) < 30 else None, ms=3, label=label)
        ax.set_xlabel("train step" if x == "step" else "wall time (s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    title = f"faint: each step; bold: mean over {window} steps" if window > 1 else None
    fig.axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title, title_fontsize=7)
    return to_png(fig)


def domain_metric_png(records: list[Record], prefix: str, suffix: str, ylabel: str, mean: str = "",
                      smooth: bool = False) -> bytes | None:
    """One curve per domain for keys `<prefix><domain><suffix>` (plus `mean` if given)."""
    metrics = [(d, f"{prefix}{d}{suffix}") for d in domains_with(records, prefix, suffix)]
    if mean:
        metrics.append(("mean", mean))
    return curves_png(records, metrics, ylabel, smooth)


def _stacked(
    ax, steps: list[float], parts: Mapping[str, list[float]], title: str, ylabel: str,
    colour_keys: Mapping[str, str] | None = None, lines: Mapping[str, list[float]] | None = None,
) -> None:
    """`parts` stacked as bars per step (they add up to the bar's height); `lines` drawn over them."""
    bottom = [0.0] * len(steps)
    width = 0.8 if len(steps) < 2 else 0.8 * min(b - a for a, b in zip(steps, steps[1:]))
    for name, values in parts.items():
        ax.bar(steps, values, width, bottom=bottom, label=name, color=colour((colour_keys or {}).get(name, name)))
        bottom = [b + v for b, v in zip(bottom, values)]
    top = max([*bottom, *(v for values in (lines or {}).values() for v in values), 0.0])
    for name, values in (lines or {}).items():  # durations beside the step, not parts of it
        ax.plot(steps, values, color=colour((colour_keys or {}).get(name, name)), marker="o",
                ms=3 if len(steps) < 60 else 0, linewidth=1.2, label=name)
    ax.set_ylim(0, 1.05 * top if top > 0 else 1.0)  # every bar and line whole
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("train step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    ax.grid(alpha=0.3, axis="y")


def step_breakdown_png(records: list[Record]) -> bytes | None:
    """Left: what came before the RL steps (start-up, warm start, first evaluation: `time/startup`), on its own
    scale, so a long warm-up does not flatten the steps. Middle: the driver's step wall time (`time/step`) as
    the two parts that add up to it — waiting for the batch, and the rest of the step (a train step and its
    weight sync landed in line, an evaluation, a checkpoint) — with the train step and the weight sync
    (generation suspended) as lines beside them: in the default mode they overlap the wait, so stacking them
    would add up to more than the step. Right: where a trajectory's time went, mean per trajectory of the
    batch (time/<phase> ÷ trajectories). Rollout overlaps the driver's step: its phases are
    trajectory-seconds, not a share of the step, hence a panel of their own."""
    if any(r.get("time/step") is not None for r in records):  # not the run's final counters (no step ran)
        records = [r for r in records if r.get("time/step") is not None]
    steps = [float(r["step"]) for r in records]

    def col(name: str) -> list[float]:
        return [float(r.get(name) or 0.0) for r in records]

    driver, beside = driver_step_parts(records)
    has_driver = any(any(v) for v in (*driver.values(), *beside.values()))
    n = col("rollout/trajectories")
    phases = {p: [t / k if k else 0.0 for t, k in zip(col(f"time/{p}"), n)] for p in PHASES}
    has_phases = any(any(v) for v in phases.values())
    before_rl = [r for r in records if r.get("time/startup") is not None]
    if not (has_driver or has_phases):
        return None
    fig = Figure(figsize=(12, 3.8))
    grid = fig.add_gridspec(1, 3, width_ratios=[1.3 if before_rl else 0.01, 5, 5], wspace=0.35)
    if before_rl:
        _before_rl(fig.add_subplot(grid[0, 0]), before_rl)
    if has_driver:
        colour_keys = {"waiting for the batch": "get_batch_wait", "rest of the step": "other",
                       "train step": "train", "weight sync (generation suspended)": "weights.exposed"}
        _stacked(fig.add_subplot(grid[0, 1]), steps, driver, "driver step wall time (RL steps)", "seconds",
                 colour_keys, beside)
    if has_phases:
        _stacked(fig.add_subplot(grid[0, 2]), steps, phases, "trajectory time by phase (mean per trajectory)",
                 "seconds")
    return to_png(fig)


def driver_step_parts(records: list[Record]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per step record: the parts of `time/step` (they add up to it) and the durations beside them."""
    def col(name: str) -> list[float]:
        return [float(r.get(name) or 0.0) for r in records]

    wait = col("time/get_batch_wait")
    parts: dict[str, list[float]] = {"waiting for the batch": wait}
    if any(r.get("time/step") is not None for r in records):
        parts["rest of the step"] = [max(0.0, t - w) for t, w in zip(col("time/step"), wait)]
    beside = {"train step": col("time/train"), "critic (inside the train step)": col("time/critic"),
              "weight sync (generation suspended)": col("time/weights.exposed")}
    return parts, {name: values for name, values in beside.items() if any(values)}


def _before_rl(ax, records: list[Record]) -> None:
    """One bar per (re)start: its warm start, and the rest of what preceded its first RL step."""
    xs = list(range(len(records)))
    warm = [float(r.get("time/warm_start") or 0.0) for r in records]
    rest = [max(0.0, float(r["time/startup"]) - w) for r, w in zip(records, warm)]
    ax.bar(xs, warm, 0.6, label="warm start", color=colour("warm_start"))
    ax.bar(xs, rest, 0.6, bottom=warm, label="start-up,\nfirst eval", color=colour("other"))
    ax.set_xticks(xs)
    ax.set_xticklabels([f"before\nstep {int(r['step'])}" for r in records], fontsize=7)
    ax.set_title("before RL", fontsize=10)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    ax.grid(alpha=0.3, axis="y")


def utilisation_png(records: list[Record], overall: Mapping[str, float]) -> bytes | None:
    """Left: pools/<pool>/utilisation per step; right: whole-run utilisation per pool from the timeline."""
    pools = domains_with(records, "pools/", "/utilisation")
    if not pools and not overall:
        return None
    fig = Figure(figsize=(11, 3.4))
    if pools:
        ax = fig.add_subplot(1, 2, 1)
        for p in pools:
            xs, ys = series(records, f"pools/{p}/utilisation")
            ax.plot(xs, [100 * y for y in ys], marker="o" if len(xs) < 30 else None, ms=3, label=p)
        ax.set_ylim(0, 105)
        ax.set_xlabel("train step")
        ax.set_ylabel("utilisation (%)")
        ax.set_title("per step", fontsize=10)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, frameon=False)
        ax.grid(alpha=0.3)
    if overall:
        ax = fig.add_subplot(1, 2, 2)
        names = list(overall)
        ax.barh(names, [100 * overall[p] for p in names], color="#1f77b4")
        for i, p in enumerate(names):
            ax.text(100 * overall[p] + 1, i, f"{100 * overall[p]:.0f}%", va="center", fontsize=8)
        ax.set_xlim(0, 110)
        ax.set_xlabel("busy time / wall time (%)")
        ax.set_title("whole run (from the timeline)", fontsize=10)
    return to_png(fig)


def staleness_histogram(records: list[Record]) -> dict[int, float]:
    """Total trained trajectories per staleness k over the run (from buffer/staleness_<k>)."""
    hist: dict[int, float] = defaultdict(float)
    for rec in records:
        for key, value in rec.items():
            suffix = key[len("buffer/staleness_"):]
            if key.startswith("buffer/staleness_") and suffix.isdigit() and isinstance(value, (int, float)):
                hist[int(suffix)] += value
    return dict(sorted(hist.items()))


def staleness_png(hist: Mapping[int, float]) -> bytes | None:
    if not hist:
        return None
    fig = Figure(figsize=(5.5, 3.2))
    ax = fig.add_subplot(1, 1, 1)
    ks = list(hist)
    ax.bar(ks, [hist[k] for k in ks], color="#1f77b4")
    ax.set_xticks(ks)
    ax.set_xlabel("staleness k = train version − behaviour version")
    ax.set_ylabel("trajectories trained")
    ax.grid(alpha=0.3, axis="y")
    return to_png(fig)


def _gantt(rows: list[tuple[str, list[TraceSpan]]], title: str, alpha: float, marks: Sequence[Mark] = (),
           capped_at: float | None = None, run_end: float | None = None) -> bytes:
    """A Gantt chart of `rows`. With `capped_at` (the trace cap was reached then), the axis runs to the run's
    end and the part after the cap is shaded and labelled: trajectories there were not recorded."""
    fig = Figure(figsize=(11, max(2.5, 0.8 + 0.3 * len(rows))))
    ax = fig.add_subplot(1, 1, 1)
    names: dict[str, None] = {}
    for y, (_, spans) in enumerate(rows):
        by_name: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for s in spans:
            by_name[s.name].append((s.start, max(s.end - s.start, 0.0)))
            names[s.name] = None
        for name, bars in by_name.items():
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colour(name), alpha=alpha, linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since run start")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    starts = [s.start for _, spans in rows for s in spans]
    ends = [s.end for _, spans in rows for s in spans]
    last = max([*ends, run_end or 0.0]) if capped_at is not None else max(ends)
    pad = 0.02 * max(last - min(starts), 1e-3)
    lo, hi = min(starts) - pad, last + pad
    ax.set_xlim(lo, hi)
    if capped_at is not None and math.isfinite(capped_at) and capped_at <= hi:  # (a cap past the run's end: none)
        ax.axvspan(max(capped_at, lo), hi, color="#999999", alpha=0.15, hatch="//", linewidth=0)
        ax.annotate(f"trace cap reached at {capped_at:.0f} s: later trajectories are not recorded\n"
                    "(observability.timeline_max_trajectories)", (max(capped_at, lo), 1.0),
                    xycoords=("data", "axes fraction"), xytext=(4, -4), textcoords="offset points",
                    fontsize=7, color="#555555", va="top")
    handles = [Patch(color=colour(n), label=n) for n in names]
    shown: dict[str, str] = {}
    for mark in (m for m in marks if lo <= m.time <= hi):  # faults: a line across every row, labelled
        shade = MARK_COLOURS.get(mark.name, MARK_DEFAULT_COLOUR)
        ax.axvline(mark.time, color=shade, linewidth=1.2, linestyle="--")
        label = f"{mark.name}: {mark.worker}" if mark.worker else mark.name
        ax.annotate(label, (mark.time, 0), xycoords=("data", "axes fraction"), rotation=90, fontsize=6,
                    color=shade, va="bottom", ha="right")
        shown[mark.name] = shade
    handles += [Patch(color=c, label=f"┆ {n}") for n, c in shown.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return to_png(fig)


def trajectory_gantt_png(trace: Trace, max_rows: int) -> bytes | None:
    """Rows = the last `max_rows` trajectories to start (a contiguous window, so overlaps between
    trajectories — the asynchrony — stay visible at a readable scale), bars = their phases."""
    by_traj: dict[str, list[TraceSpan]] = defaultdict(list)
    ended: dict[str, str] = {}
    for s in trace.spans:
        if s.view == "trajectory" and s.name == "trajectory":
            ended[s.trajectory_id] = s.status
        elif s.view == "trajectory":
            by_traj[s.trajectory_id].append(s)
    if not by_traj:
        return None
    ordered = sorted(by_traj.items(), key=lambda kv: min(s.start for s in kv[1]))[-max_rows:]

    def label(trajectory_id: str, domain: str) -> str:
        status = ended.get(trajectory_id, "")
        return f"{trajectory_id} [{domain}]" + (f" {status.upper()}" if status not in ("", "completed", "truncated") else "")

    rows = [(label(trajectory_id, spans[0].domain), spans) for trajectory_id, spans in ordered]
    shown = "all" if len(rows) == len(by_traj) else f"the last {len(rows)} to start, of"
    recorded = f" recorded; {trace.meta.get('dropped_trajectories', 0)} after the trace cap are not" if (
        trace.capped_at is not None) else ""
    return _gantt(rows, f"trajectories ({shown} {len(by_traj)}{recorded})", alpha=1.0, marks=trace.marks)


def worker_gantt_png(trace: Trace) -> bytes | None:
    """Rows = workers; concurrent requests on one worker overlap, drawn translucent (darker = more)."""
    by_worker: dict[str, list[TraceSpan]] = defaultdict(list)
    for s in trace.spans:
        if s.view == "worker":
            by_worker[s.worker].append(s)
    if not by_worker:
        return None
    capped = "" if trace.capped_at is None else f"; trace capped at {trace.capped_at:.0f} s"
    return _gantt(sorted(by_worker.items()), f"workers (overlapping bars = concurrent requests{capped})",
                  alpha=0.45, marks=trace.marks, capped_at=trace.capped_at, run_end=trace.end)
