"""Live progress of a training run: step, ETA, reward per domain, step time, staleness.

In: `update(step, total_steps, metrics)` after each step (`step` = steps completed, 1-based; `metrics` =
what was logged for it, names as in `aggregate.py`). Out, by `observability.progress`:
- `rich`: a live bar with the status line (rich.progress) when the console is a terminal, and plain lines
  otherwise (logs, CI, pipes), so the mode is safe everywhere;
- `plain`: one line per step, `[rollart] step 3/40 | eta 1m23s | step 2.10s | stale 0.50 | reward …`;
- `quiet`: nothing.

Guarantees: ETA is the mean time of the RL steps seen by this object times the steps left — their
`time/step`, which leaves out what came before the first RL step (start-up, the warm start, the first
evaluation: a fixed cost, not a per-step one), or the wall time between updates when a step does not report
it (a resumed run measures from its first update); `status_line` is a pure function, the same text in every
mode.
"""

from __future__ import annotations

import sys
import time
from typing import Literal, Mapping, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.progress import Progress as RichProgress

ProgressMode = Literal["rich", "plain", "quiet"]


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def status_line(step: int, total_steps: int, metrics: Mapping[str, float], eta_s: float | None) -> str:
    parts = [f"step {step}/{total_steps}", f"eta {format_duration(eta_s)}"]
    if "time/step" in metrics:
        parts.append(f"step {metrics['time/step']:.2f}s")
    if "buffer/staleness_mean" in metrics:
        parts.append(f"stale {metrics['buffer/staleness_mean']:.2f}")
    rewards = sorted(
        (k[len("env/"): -len("/reward")], v) for k, v in metrics.items()
        if k.startswith("env/") and k.endswith("/reward")
    )
    if rewards:
        parts.append("reward " + " ".join(f"{d}={v:.3f}" for d, v in rewards))
    if "eval/mean" in metrics:
        parts.append(f"eval {metrics['eval/mean']:.3f}")
    return " | ".join(parts)


class Progress:
    """The progress display the driver updates once per step; `close()` when the run ends."""

    def __init__(self, mode: ProgressMode = "rich", *, file: TextIO | None = None, console: Console | None = None):
        if mode not in ("rich", "plain", "quiet"):
            raise ValueError(f"observability.progress: '{mode}' is not one of rich, plain, quiet")
        self._file = file or sys.stdout
        self._console = console or Console(file=self._file)
        self.mode: ProgressMode = "plain" if mode == "rich" and not self._console.is_terminal else mode
        self._t0 = time.monotonic()
        self._first_step: int | None = None
        self._step_times: list[float] = []  # time/step of the updates seen
        self._bar: RichProgress | None = None
        self._task = None

    def eta(self, step: int, total_steps: int) -> float | None:
        if self._first_step is None or step <= self._first_step:
            return None
        if len(self._step_times) == step - self._first_step:  # every step said how long it took
            per_step = sum(self._step_times) / len(self._step_times)
        else:
            per_step = (time.monotonic() - self._t0) / (step - self._first_step)
        return per_step * max(0, total_steps - step)

    def update(self, step: int, total_steps: int, metrics: Mapping[str, float]) -> None:
        if self._first_step is None:
            self._first_step = step - 1  # the clock started one step before the first update
        if "time/step" in metrics:
            self._step_times.append(float(metrics["time/step"]))
        if self.mode == "quiet":
            return
        line = status_line(step, total_steps, metrics, self.eta(step, total_steps))
        if self.mode == "plain":
            print(f"[rollart] {line}", file=self._file, flush=True)
            return
        if self._bar is None:
            self._bar = RichProgress(
                TextColumn("[bold]rollart"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                console=self._console,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=total_steps, info="")
        self._bar.update(self._task, completed=step, total=total_steps, info=line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
