"""The first RL step's time/step is an RL step: start-up, warm start and first evaluation are logged apart
(time/startup, time/warm_start), and the report's step-time plot draws them on their own scale."""

from __future__ import annotations

import time

from rollart.config import RunConfig
from rollart.observability import plots
from rollart.observability.records import read_metrics
from rollart.job.recorder import RunRecorder
from rollart.base.run_dir import RunPaths
from rollart.types import Span, TimedMetrics


def test_what_precedes_the_first_rl_step_is_logged_apart_from_its_step_time(tmp_path):
    cfg = RunConfig(run_dir=str(tmp_path / "run"))
    cfg.observability.tensorboard = False
    cfg.observability.progress = "quiet"
    recorder = RunRecorder(cfg, resume_step=None, started_at=time.time() - 5.0)  # 5 s of start-up already
    recorder.phase(TimedMetrics({"time/warm_start": 3.0}, Span("warm_start", 0.0, 3.0, "driver")))
    recorder.rl_starts()
    recorder.step(0, [], 0, {})
    recorder.step(1, [], 1, {})
    recorder.close()
    records = read_metrics(RunPaths.of(cfg.run_dir).metrics)
    first, second = records[0], records[1]
    assert first["time/startup"] >= 5.0 and first["time/warm_start"] == 3.0
    assert first["time/step"] < 1.0  # the start-up is not in the first step's time
    assert "time/startup" not in second
    assert plots.step_breakdown_png(records)  # draws, with the before-RL panel
