"""summary.json's wall time is the run's over all its attempts: a resumed run counts on from its checkpoint's
wall time, or from its last summary's when the earlier attempt went on past its last checkpoint; the run
directory's summary is data — anything but a number there is ignored."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rollart.config.loader import load_config
from rollart.job.recorder import RunRecorder, resumed_wall_s
from rollart.types import RunState


def test_the_checkpoint_keeps_the_runs_wall_time() -> None:
    state = RunState(step=3, run_id="r", wall_s=125.5)
    assert RunState.from_checkpoint(state.to_checkpoint()).wall_s == 125.5
    assert RunState.from_checkpoint({"step": 1}).wall_s == 0.0  # a checkpoint from before the field
    for bad in (-1, "12", True, float("nan")):
        with pytest.raises(ValueError, match="field 'wall_s'"):
            RunState.from_checkpoint({"wall_s": bad})


def test_a_resumed_runs_wall_time_counts_on_from_its_earlier_attempts(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    assert resumed_wall_s(tmp_path, 40.0) == 40.0  # no summary yet
    summary.write_text(json.dumps({"wall_s": 95.0}))  # the attempt went on 55 s past its checkpoint
    assert resumed_wall_s(tmp_path, 40.0) == 95.0
    assert resumed_wall_s(tmp_path, 120.0) == 120.0
    for junk in ('{"wall_s": "x"}', "[1, 2]", "not json", '{"wall_s": -3}'):
        summary.write_text(junk)
        assert resumed_wall_s(tmp_path, 40.0) == 40.0
    summary.unlink()
    cfg = load_config(None, [f"run_dir={tmp_path}", "observability.progress=quiet"])
    recorder = RunRecorder(cfg, resume_step=3, started_at=time.time() - 10.0, wall_before=95.0)
    try:
        total = recorder.flush()
        assert total["wall_s_this_attempt"] >= 10.0  # (from started_at: start-up included)
        assert abs(total["wall_s"] - total["wall_s_this_attempt"] - 95.0) < 0.5
        assert json.loads(summary.read_text())["wall_s"] == total["wall_s"]
    finally:
        recorder.close()
