"""Metric sinks: where a `MetricRecord` goes. JSONL always; TensorBoard, W&B and MLflow when configured.

In: one `MetricRecord` per `write`. Out: a line in RUN_DIR/metrics.jsonl, TensorBoard scalars, a W&B or
MLflow step. Every sink has `write(record)` and `close()`; the `MetricsLogger` owns a list of them.

Guarantees:
- JSONL lines are strict JSON (NaN and ±inf are written as null) and flushed per line, so a crashed run
  keeps everything logged before the crash and a live reader sees each step as it lands. A resumed run
  (`purge_step`) first drops the records at steps it will log again, as TensorBoard's purge_step does.
- TensorBoard uses torch's `SummaryWriter` (the writer everyone already has with torch); W&B and MLflow
  are imported only when configured, and a configured but missing package is an error that says what to
  install or which field to clear, raised before the run starts.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol

from rollart.base.run_dir import RunPaths


@dataclass(frozen=True)
class MetricRecord:
    step: int
    wall_s: float  # seconds since the run started
    time: float  # unix time of the log call
    values: Mapping[str, float]

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "wall_s": round(self.wall_s, 6), "time": self.time}
        out.update({k: (v if math.isfinite(v) else None) for k, v in self.values.items()})
        return out


class Sink(Protocol):
    def write(self, record: MetricRecord) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """metrics.jsonl, opened (and rewritten on resume) without following a link (`rollart.base.run_dir`)."""

    def __init__(self, paths: RunPaths, purge_step: int | None = None) -> None:
        if purge_step is not None and os.path.lexists(paths.metrics):
            drop_steps_from(paths, paths.metrics, purge_step)
        # append: a resumed run continues the same file; readers merge records by step, newest last
        self._file = paths.open(paths.metrics, "a")

    def write(self, record: MetricRecord) -> None:
        self._file.write(json.dumps(record.as_json(), allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def drop_steps_from(paths: RunPaths, path: Path, first_dropped: int) -> None:
    """Rewrite a JSONL file of {"step", …} records (metrics.jsonl, samples.jsonl) without the records at steps
    ≥ first_dropped (and without a torn, overlong or unreadable line), streaming: memory stays bounded
    whatever the file holds."""

    def kept() -> Iterator[bytes]:
        for _, line in paths.lines(path):
            try:
                if line is not None and int(json.loads(line)["step"]) < first_dropped:
                    yield line + b"\n"
            except (ValueError, KeyError, TypeError, IndexError, RecursionError, OverflowError):
                continue  # a line torn by the crash, or not a record

    paths.write(path, kept())


class TensorBoardSink:
    def __init__(self, paths: RunPaths, flush_s: float, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = paths.make_dir(paths.tensorboard)  # a link there is refused: the event files go where the run is
        # purge_step: TensorBoard hides events of an earlier (crashed) writer at steps ≥ purge_step
        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=max(1, int(flush_s)), purge_step=purge_step)

    def write(self, record: MetricRecord) -> None:
        for name, value in record.values.items():
            self._writer.add_scalar(name, value, global_step=record.step, walltime=record.time)

    def text(self, step: int, tag: str, markdown: str) -> None:
        """Markdown under `tag` in TensorBoard's text tab (the readable rollouts: samples/<domain>)."""
        self._writer.add_text(tag, markdown, global_step=step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


def _import_optional(module: str, field: str, value: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise RuntimeError(
            f"observability.{field}={value!r} needs the '{module}' package, which is not installed: "
            f"`pip install {module}`, or set observability.{field}='' to log without it"
        ) from None


class WandbSink:
    def __init__(self, project: str, entity: str, run_dir: Path, hparams: Mapping[str, Any]) -> None:
        self._wandb = _import_optional("wandb", "wandb_project", project)
        self._run = self._wandb.init(
            project=project, entity=entity or None, name=run_dir.name, dir=str(run_dir), config=dict(hparams)
        )

    def write(self, record: MetricRecord) -> None:
        self._run.log(dict(record.values), step=record.step)

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    def __init__(self, uri: str, experiment: str, run_dir: Path, hparams: Mapping[str, Any]) -> None:
        self._mlflow = _import_optional("mlflow", "mlflow_uri", uri)
        self._mlflow.set_tracking_uri(uri)
        self._mlflow.set_experiment(experiment)
        self._mlflow.start_run(run_name=run_dir.name)
        if hparams:
            # one artefact instead of per-key params: MLflow caps param count and value length
            self._mlflow.log_dict(dict(hparams), "config.json")

    def write(self, record: MetricRecord) -> None:
        self._mlflow.log_metrics(dict(record.values), step=record.step)

    def close(self) -> None:
        self._mlflow.end_run()
