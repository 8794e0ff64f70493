"""RunRecorder: what a training run leaves behind and shows while it runs.

In: from the driver, per step the trained batch, its phases' `TimedMetrics` (metrics and timeline span)
and plane metrics; evaluation scores; warm-start progress. Out (the run directory contract of
`rollart.base.run_dir.RunPaths`): config.yaml, metrics.jsonl (+ TensorBoard and W&B/MLflow when configured),
samples.jsonl (a few trained trajectories per domain and step, as text: `observability.samples_per_domain`),
timeline.json (Chrome trace), summary.json, report/index.html; and live progress on the terminal (rich,
plain or quiet).

It is the real run's `rollart.loop.LoopRecorder` (`rl_starts`, `phase`, `train_step_done`, `step`,
`evaluation`, `wall_s`); the driver adds the warm start's progress, the final counters and the summary. The ledger
file (every trajectory's moves) is not the recorder's: the rollout scheduler writes it as it goes
(`rollart.observability.ledger.LedgerFile`, owned by the system).

Guarantees: the timeline and the summary are rewritten at every evaluation, so a run that dies keeps what
it did; `close()` is idempotent and flushes every sink. A resumed run's wall time (summary.json `wall_s`,
metrics.jsonl's `wall_s`) counts on from its earlier attempts' (`resumed_wall_s`: the checkpoint's, or the
last summary's when that attempt went on past its checkpoint); `wall_s_this_attempt` is this start's alone.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from rollart.config import RunConfig
from rollart.config.loader import write_resolved
from rollart.observability import (
    MetricsLogger,
    Progress,
    Timeline,
    batch_metrics,
    system_metrics,
    utilisation_metrics,
    write_summary,
)
from rollart.models import load_tokenizer
from rollart.observability.samples import SampleLog
from rollart.base.run_dir import RunPaths
from rollart.observability.timeline import Mark
from rollart.types import Evaluation, TimedMetrics, Trajectory

log = logging.getLogger("rollart")


def resumed_wall_s(run_dir: str | Path, checkpointed: float) -> float:
    """The wall time of a run's earlier attempts: what its checkpoint kept, or — an attempt that went on past its
    last checkpoint (killed, or stopped after it) — what its last summary said, whichever is later. The summary
    is the run directory's data: anything but a number ≥ 0 there is ignored."""
    paths = RunPaths.of(run_dir)
    try:
        previous = json.loads(paths.read_text(paths.summary)).get("wall_s")
    except (OSError, ValueError, AttributeError):
        previous = None
    if isinstance(previous, (int, float)) and not isinstance(previous, bool) and 0 <= previous < float("inf"):
        return max(checkpointed, float(previous))
    return checkpointed


class RunRecorder:
    def __init__(self, cfg: RunConfig, resume_step: int | None, workers: Sequence[str] = (),
                 started_at: float | None = None, incidents: Sequence[Mark] = (),
                 eval_first: Mapping[str, float] | None = None, model_path: str | Path | None = None,
                 wall_before: float = 0.0) -> None:
        """`eval_first`: the first evaluation's scores of the run a resume continues (the summary's
        baseline); a fresh run's is its own first evaluation. `model_path`: the checkpoint whose tokenizer
        decodes the samples (`observability.samples_per_domain`); None writes none. `wall_before`: the wall time
        of the run's earlier attempts (`resumed_wall_s`), which this one's wall_s counts on from."""
        self.cfg = cfg
        self.t0 = started_at or time.time()  # wall_s counts from the start of the run (start-up included)
        self.wall_before = wall_before
        self.paths = RunPaths.of(cfg.run_dir)
        write_resolved(cfg, cfg.run_dir)
        self.logger = MetricsLogger(cfg.run_dir, cfg.observability, start_time=self.t0 - wall_before,
                                    hparams=cfg.model_dump(mode="json"), resume_step=resume_step)
        self.timeline = Timeline(start_time=self.t0, max_trajectories=cfg.observability.timeline_max_trajectories)
        self.progress = Progress(cfg.observability.progress)
        self.samples = self._sample_log(model_path, resume_step)
        self.workers = list(workers)
        self.evals: dict[int, dict[str, float]] = {}
        self.eval_first = dict(eval_first) if eval_first is not None else None
        self.steps_done = 0
        self._pending: dict[str, float] = {}  # phase metrics waiting for the next step record (summed)
        self._step_start = self.t0
        self._incidents = incidents  # the system's deaths, joins, rebuilds: appended to while the run goes on
        self._marked = 0
        self._closed = False

    def _sample_log(self, model_path: str | Path | None, resume_step: int | None) -> SampleLog | None:
        obs = self.cfg.observability
        if not obs.samples_per_domain or model_path is None:
            return None
        tokenizer = load_tokenizer(model_path)  # special tokens kept: the chat template as the model saw it
        return SampleLog(self.paths.samples, obs.samples_per_domain,
                         decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False),
                         max_chars=obs.sample_max_chars, text=self.logger.text, resume_step=resume_step)

    def _add_span(self, phase: TimedMetrics) -> None:
        if phase.span is not None and phase.span.end > phase.span.start:
            self.timeline.add_span(phase.span)

    def phase(self, phase: TimedMetrics) -> None:
        """A driver phase (weight sync, batch wait): its span goes on the timeline, its metrics into the
        next step record (summed over the phases since the last one)."""
        self._add_span(phase)
        for key, value in phase.metrics.items():
            self._pending[key] = self._pending.get(key, 0.0) + float(value)

    def on_warm_start_step(self, step: int, total: int, metrics: Mapping[str, float]) -> None:
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == total:
            log.info("warm start %d/%d: sft loss %.3f", step + 1, total, metrics.get("sft/loss", float("nan")))

    def rl_starts(self) -> None:
        """The first RL step begins now. Everything before it — Ray and the workers starting, the warm start,
        the first evaluation — is logged as `time/startup` in that step's record, so its `time/step` is an
        RL step like the others (the report draws the two apart)."""
        now = time.time()
        self._pending["time/startup"] = now - self._step_start
        self._step_start = now

    def train_step_done(self, step: int, train_step: TimedMetrics) -> None:
        """The train step on batch `step` (it finishes while later batches roll out)."""
        self._add_span(train_step)
        # trainer stats come namespaced (train/, time/, weights/); a bare name belongs under train/
        self.logger.log(step, {(k if "/" in k else f"train/{k}"): float(v) for k, v in train_step.metrics.items()})

    def step(self, step: int, batch: Sequence[Trajectory], version: int, metrics: Mapping[str, float]) -> None:
        now = time.time()
        for t in batch:
            self.timeline.add_trajectory(t)
        step_s = now - self._step_start
        tokens = sum(t.num_response_tokens for t in batch)
        record = {
            **batch_metrics(batch, version, self.cfg.rollout.staleness),
            **utilisation_metrics(self.timeline.window_spans(self._step_start), (self._step_start, now),
                                  self.workers),
            **system_metrics(tokens, step_s),
            **metrics,
            **self._pending,
            "time/step": step_s,
        }
        self._pending = {}
        self._mark_incidents()
        self.logger.log(step, record)
        if self.samples is not None:
            self.samples.write(step, version, batch)
        self.progress.update(step + 1, self.cfg.train.steps, record)
        self.steps_done = step + 1
        self._step_start = now

    def final(self, metrics: Mapping[str, float]) -> None:
        """The planes' counters at the end of the run, logged at step `train.steps`."""
        self.logger.log(self.cfg.train.steps, dict(metrics))

    def evaluation(self, step: int, evaluation: Evaluation) -> None:
        scores = evaluation.scores
        self.evals[step] = dict(scores)
        record = {f"eval/{d}/score": s for d, s in scores.items()}
        record |= {f"eval/{d}/scored": float(n) for d, n in evaluation.scored.items()}
        record |= {f"eval/{d}/failed": float(n) for d, n in evaluation.failed.items()}
        if evaluation.mean is not None:
            record["eval/mean"] = evaluation.mean
        self.logger.log(step, record)
        failed = sum(evaluation.failed.values())
        log.info("eval after %d steps: mean %s %s%s", step,
                 "—" if evaluation.mean is None else f"{evaluation.mean:.3f}",
                 " ".join(f"{d}={s:.3f}" for d, s in sorted(scores.items())),
                 f" ({failed} episode{'s' * (failed != 1)} failed, not scored: {dict(evaluation.failed)})"
                 if failed else "")
        self.flush()

    def summary(self) -> dict[str, Any]:
        """The summary of the run so far (`eval_first` survives a resume)."""
        first = dict(self.eval_first or (self.evals[min(self.evals)] if self.evals else {}))
        last = self.evals[max(self.evals)] if self.evals else {}

        def mean(d: Mapping[str, float]) -> float | None:
            return sum(d.values()) / len(d) if d else None

        return {
            "eval_first": mean(first), "eval_last": mean(last),
            "eval_first_by_domain": first, "eval_last_by_domain": last,
            "eval_gain": (mean(last) - mean(first)) if first and last else None,
            "steps": self.steps_done, "wall_s": self.wall_s(), "wall_s_this_attempt": time.time() - self.t0,
        }

    def wall_s(self) -> float:
        """The run's wall time so far: its earlier attempts' and this one's (start-up included)."""
        return self.wall_before + time.time() - self.t0

    def _mark_incidents(self) -> None:
        """Put the incidents not on the timeline yet on it (lines across the Gantt charts)."""
        new = list(self._incidents[self._marked:])
        self._marked += len(new)
        for mark in new:
            self.timeline.add_mark(mark)

    def flush(self) -> dict[str, Any]:
        self._mark_incidents()
        if self.cfg.observability.timeline:
            self.timeline.write(self.paths.timeline)
        extra = self.summary()
        write_summary(self.cfg.run_dir, extra)
        return extra

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.samples is not None:
                self.samples.close()
            self.logger.close()
            self.progress.close()
