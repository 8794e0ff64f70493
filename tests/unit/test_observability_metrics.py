"""Metric aggregation, names, the JSONL/TensorBoard logger, optional sinks and the run summary."""

from __future__ import annotations

import json
import math
import sys
import types

import pytest

from rollart.config import ObservabilityConfig
from rollart.observability import (
    MetricsLogger,
    batch_metrics,
    prefixed,
    read_metrics,
    span_time_totals,
    staleness_metrics,
    summarize,
    utilisation_metrics,
    write_summary,
)
from rollart.types import Span, Status, Task, Trajectory, Turn

NO_TB = ObservabilityConfig(tensorboard=False)


def traj(tid, domain, reward, *, group="g0", version=0, turns=((3, 2),), status=Status.COMPLETED,
         spans=(), turn_versions=None, metrics=None):
    ts = tuple(
        Turn(tuple(range(p)), tuple(range(r)), (-1.0,) * r, ((turn_versions or version),) * r,
             spans=(Span("generate", 0.0, 1.0, "inference/gen_decode/0"), Span("env.step", 1.0, 1.5, "env/env/0")))
        for p, r in turns
    )
    t = Trajectory(tid, Task(tid, domain, domain, 0, group), version, ts, spans=tuple(spans),
                   metrics=metrics or {}).finished(status)
    return t.scored(reward) if reward is not None else t


def test_batch_metrics_per_domain_and_rollout():
    batch = [
        traj("a", "math", 1.0, turns=((4, 2),)),
        traj("b", "math", 0.0, turns=((4, 4),)),
        traj("c", "lake", 0.5, group="g1", turns=((3, 1), (2, 1)), metrics={"prefill_tokens": 2}),
        traj("d", "lake", 0.5, group="g1", turns=((3, 1),), status=Status.TRUNCATED),
    ]
    m = batch_metrics(batch, train_version=0)
    assert m["rollout/trajectories"] == 4 and m["rollout/groups"] == 2
    assert m["rollout/prompt_tokens"] == 4 + 4 + 5 + 3 and m["rollout/response_tokens"] == 2 + 4 + 2 + 1
    assert m["rollout/turns_mean"] == 5 / 4
    assert m["rollout/truncated_frac"] == 0.25
    assert m["env/math/count"] == 2 and m["env/math/success"] == 0.5 and m["env/math/reward"] == 0.5
    assert m["env/math/decode_tokens"] == 3.0 and m["env/math/tokens"] == (6 + 8) / 2
    assert m["env/lake/turns"] == 1.5
    assert m["env/lake/prefill_tokens"] == (2 + 3) / 2  # reported by inference when present, else prompt ids
    assert m["reward/min"] == 0.0 and m["reward/max"] == 1.0 and m["reward/mean"] == 0.5
    assert m["reward/zero_std_groups"] == 0.5  # g1's rewards are equal: no GRPO signal
    assert m["time/generate"] == 5.0 and m["time/env.step"] == 2.5
    assert m["time/env.reset"] == 0.0 and m["time/buffer.wait"] == 0.0  # every phase always present


def test_success_prefers_the_env_flag():
    m = batch_metrics([traj("a", "x", 1.0, metrics={"success": 0.0}), traj("b", "x", -0.1)], 0)
    assert m["env/x/success"] == 0.0


def test_an_agents_own_metrics_are_logged_per_domain_over_the_trajectories_that_reported_them():
    batch = [traj("a", "tools", 1.0, metrics={"agent/called_search": 1.0}),
             traj("b", "tools", 0.0, metrics={"agent/called_search": 0.0, "agent/retries": 3.0}),
             traj("c", "tools", 0.0), traj("d", "math", 1.0, metrics={"calls": 2.0})]
    m = batch_metrics(batch, 0)
    assert m["env/tools/agent/called_search"] == 0.5 and m["env/tools/agent/retries"] == 3.0
    assert not any("/agent/" in k for k in m if k.startswith("env/math/"))


def test_span_totals_include_trajectory_spans_and_free_form_names():
    t = traj("a", "x", 1.0, spans=(Span("env.reset", 0, 0.25, "env/env/0"), Span("judge", 2, 3, "reward/r/0")))
    totals = span_time_totals([t])
    assert totals["time/env.reset"] == 0.25 and totals["time/judge"] == 1.0


def test_staleness_histogram_both_modes():
    batch = [traj("a", "x", 1, version=3), traj("b", "x", 1, version=2),
             traj("c", "x", 1, version=2), traj("d", "x", 1, version=4, turn_versions=2)]
    m = staleness_metrics(batch, train_version=4)
    assert (m["buffer/staleness_0"], m["buffer/staleness_1"], m["buffer/staleness_2"]) == (1, 1, 2)
    assert m["buffer/staleness_max"] == 2 and m["buffer/staleness_mean"] == 5 / 4
    tok = staleness_metrics(batch, train_version=4, mode="token")
    assert tok["buffer/staleness_2"] == 3 and "buffer/staleness_0" not in tok
    with pytest.raises(ValueError, match="newer than the train version"):
        staleness_metrics(batch, train_version=2)


def test_prefixed():
    assert prefixed("train", {"loss": 1, "train/lr": 2}) == {"train/loss": 1.0, "train/lr": 2.0}


def test_utilisation_metrics_names():
    spans = [Span("generate", 0, 1, "inference/gen_decode/0")]
    assert utilisation_metrics(spans, (0, 2), ["inference/gen_decode/1"]) == {"pools/gen_decode/utilisation": 0.25}


def test_logger_rejects_bad_names_and_values(tmp_path):
    with MetricsLogger(tmp_path, NO_TB) as log:
        with pytest.raises(ValueError, match="'loss' must be '<namespace>/<name>'"):
            log.log(1, {"loss": 1.0})
        with pytest.raises(ValueError, match="namespace of"):
            log.log(1, {"trian/loss": 1.0})
        with pytest.raises(ValueError, match="'train/loss' must be a number"):
            log.log(1, {"train/loss": "high"})
    with pytest.raises(RuntimeError, match="after close"):
        log.log(2, {"train/loss": 1.0})


def test_jsonl_records_merge_by_step_and_are_strict_json(tmp_path):
    with MetricsLogger(tmp_path, NO_TB, start_time=100.0) as log:
        log.log(1, {"train/loss": float("nan"), "time/step": 2.0}, at=103.0)
        log.log(1, {"eval/mean": 0.5}, at=104.0)
        log.log(2, {"train/loss": 0.5}, at=105.0)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    first = json.loads(lines[0])  # strict JSON: NaN became null
    assert first == {"step": 1, "wall_s": 3.0, "time": 103.0, "train/loss": None, "time/step": 2.0}
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["eval/mean"] == 0.5 and records[0]["time/step"] == 2.0 and records[0]["wall_s"] == 4.0


def test_read_metrics_skips_a_torn_last_line_but_not_a_bad_middle_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 1}\n{"step": 2, "tra')
    assert [r["step"] for r in read_metrics(path)] == [1]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(path)


def test_tensorboard_sink_writes_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, ObservabilityConfig()) as log:
        log.log(1, {"train/loss": 2.0, "pools/env/utilisation": 0.5})
        log.log(2, {"train/loss": 1.0})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 2.0), (2, 1.0)]
    assert acc.Scalars("pools/env/utilisation")[0].value == 0.5


def test_resume_supersedes_what_a_crashed_run_logged(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(tmp_path, ObservabilityConfig())
    for step in (1, 2, 3):
        log.log(step, {"train/loss": float(step)})
    log.close()  # "crashed" after step 3; the last checkpoint was step 1
    with MetricsLogger(tmp_path, ObservabilityConfig(), resume_step=2) as log:
        log.log(2, {"train/loss": 20.0})
    assert [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [(1, 1.0), (2, 20.0)]
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 20.0)]


def test_optional_sink_configured_but_missing_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb → ImportError
    with pytest.raises(RuntimeError, match=r"observability.wandb_project='proj' needs the 'wandb' package"):
        MetricsLogger(tmp_path, ObservabilityConfig(tensorboard=False, wandb_project="proj"))


def test_wandb_and_mlflow_sinks_receive_every_record(tmp_path, monkeypatch):
    calls: list[tuple] = []

    class Run:
        def log(self, values, step):
            calls.append(("wandb.log", step, values))

        def finish(self):
            calls.append(("wandb.finish",))

    wandb = types.SimpleNamespace(init=lambda **kw: calls.append(("wandb.init", kw["project"])) or Run())
    mlflow = types.SimpleNamespace(
        set_tracking_uri=lambda uri: calls.append(("mlflow.uri", uri)),
        set_experiment=lambda name: calls.append(("mlflow.experiment", name)),
        start_run=lambda run_name: calls.append(("mlflow.start", run_name)),
        log_dict=lambda d, name: calls.append(("mlflow.config", name)),
        log_metrics=lambda values, step: calls.append(("mlflow.log", step, values)),
        end_run=lambda: calls.append(("mlflow.end",)),
    )
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    cfg = ObservabilityConfig(tensorboard=False, wandb_project="p", mlflow_uri="file:///tmp/x")
    with MetricsLogger(tmp_path / "run7", cfg, hparams={"seed": 1}) as log:
        log.log(3, {"train/loss": 0.25})
    assert ("wandb.init", "p") in calls and ("mlflow.start", "run7") in calls
    assert ("wandb.log", 3, {"train/loss": 0.25}) in calls and ("mlflow.log", 3, {"train/loss": 0.25}) in calls
    assert calls[-2:] == [("wandb.finish",), ("mlflow.end",)]


def test_summary_from_metrics(tmp_path):
    with MetricsLogger(tmp_path, NO_TB, start_time=0.0) as log:
        log.log(1, {"eval/a/score": 0.1, "eval/b/score": 0.3, "rollout/reward_mean": 0.2,
                    "rollout/trajectories": 8, "buffer/stale": 1}, at=10.0)
        log.log(2, {"rollout/reward_mean": 0.4, "rollout/trajectories": 8, "buffer/stale": 3}, at=20.0)
        log.log(3, {"eval/a/score": 0.5, "eval/b/score": 0.7}, at=30.0)
    path = write_summary(tmp_path, {"completed": True})
    s = json.loads(path.read_text())
    assert s["steps"] == 3 and s["wall_s"] == 30.0 and s["completed"] is True
    assert math.isclose(s["eval_first"], 0.2) and math.isclose(s["eval_last"], 0.6)  # mean of domains
    assert s["eval_first_by_domain"] == {"a": 0.1, "b": 0.3} and s["eval_last_by_domain"] == {"a": 0.5, "b": 0.7}
    assert s["reward_first"] == 0.2 and s["reward_last"] == 0.4
    assert s["trajectories"] == 16 and s["stale_total"] == 3 and s["failed_total"] is None  # counters: last value
    empty = summarize([])
    assert empty["eval_first"] is None and empty["eval_last_by_domain"] == {} and empty["steps"] == 0
