"""`MetricsLogger`: the one object the driver logs metrics through.

In: `log(step, {"<namespace>/<name>": number})` calls. Out: the same record in every configured sink
(`sinks.py`): RUN_DIR/metrics.jsonl always, RUN_DIR/tensorboard/ when `observability.tensorboard`, W&B when
`observability.wandb_project`, MLflow when `observability.mlflow_uri`.

Guarantees:
- Names are checked (`metric_names.check_metric_name`) and values converted to float before any sink sees them:
  a bad name or a non-number is a ValueError naming it, raised at the first step that logs it.
- Several `log` calls may share a step (train metrics, then eval metrics); readers merge them by step.
- `close()` flushes and closes every sink, and is idempotent; the logger is a context manager.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from rollart.config import ObservabilityConfig
from rollart.observability.metric_names import check_metric_name
from rollart.base.run_dir import RunPaths
from rollart.observability.sinks import (
    JsonlSink,
    MetricRecord,
    MlflowSink,
    Sink,
    TensorBoardSink,
    WandbSink,
)


class MetricsLogger:
    """Fan-out of metric records to the sinks `cfg` asks for.

    `start_time` is the unix time the run started (wall_s is measured from it); by default, now.
    `hparams` (e.g. `cfg.model_dump(mode="json")`) is recorded as the W&B config / an MLflow artefact.
    `resume_step`: a resumed run's first step; what a crashed run logged at that step and later is
    dropped (from metrics.jsonl, and hidden in TensorBoard by its purge_step).
    """

    def __init__(
        self,
        run_dir: str | Path,
        cfg: ObservabilityConfig,
        *,
        start_time: float | None = None,
        hparams: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.paths = RunPaths.of(run_dir)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.start_time = time.time() if start_time is None else float(start_time)
        sinks: list[Sink] = []
        self._sinks: list[Sink] | None = sinks
        try:
            sinks.append(JsonlSink(self.paths, resume_step))
            if cfg.tensorboard:
                sinks.append(TensorBoardSink(self.paths, cfg.tensorboard_flush_s, resume_step))
            if cfg.wandb_project:
                sinks.append(WandbSink(cfg.wandb_project, cfg.wandb_entity, self.paths.root, hparams or {}))
            if cfg.mlflow_uri:
                sinks.append(MlflowSink(cfg.mlflow_uri, cfg.mlflow_experiment, self.paths.root, hparams or {}))
        except BaseException:
            self.close()  # a sink that failed to start must not leave the others' files open
            raise

    def log(self, step: int, metrics: Mapping[str, float], *, at: float | None = None) -> MetricRecord:
        """Record `metrics` at `step` in every sink; returns the record written.

        `at`: the unix time the values refer to (default now), e.g. the end of the step they measure."""
        if self._sinks is None:
            raise RuntimeError("MetricsLogger.log called after close()")
        values: dict[str, float] = {}
        for name, value in metrics.items():
            check_metric_name(name)
            try:
                values[name] = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"metric '{name}' must be a number, got {value!r}") from None
        now = time.time() if at is None else float(at)
        record = MetricRecord(step=int(step), wall_s=now - self.start_time, time=now, values=values)
        for sink in self._sinks:
            sink.write(record)
        return record

    def text(self, step: int, tag: str, markdown: str) -> None:
        """Markdown at `step` in every sink that shows text (TensorBoard's text tab); the others skip it."""
        for sink in self._sinks or ():
            show = getattr(sink, "text", None)
            if show is not None:
                show(step, tag, markdown)

    def close(self) -> None:
        sinks, self._sinks = self._sinks, None
        for sink in sinks or ():
            sink.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
