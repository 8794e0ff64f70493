"""A short real training run of the SWE repair domain (examples/swe/swe.yaml, made shorter), on the shared
test Ray: the warm start on the scripted expert's demonstrations, then RL steps whose trajectories run
tools in workspace sandboxes taken from the warm pool; the run completes and reports per-domain reset
metrics in metrics.jsonl and the report (~50 s here: in process, to share the test Ray and tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from testutil import free_port

from rollart.config.loader import load_config
from rollart.job.driver import train
from rollart.observability import read_metrics
from rollart.observability.report import build_report

pytestmark = [pytest.mark.slow, pytest.mark.ray]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "swe" / "swe.yaml"
STEPS = 2


def test_a_short_swe_run_warm_starts_trains_and_reports_resets(ray_local, tiny_model_path, tmp_path):
    run_dir = tmp_path / "swe"
    # two turns are the expert's episode (apply the patch, submit); 64 new tokens keep the tiny model's
    # RL turns short (its calls are malformed at any length: a format penalty, not a crash — so the reward is
    # the penalty of every turn, -0.1 × turns; benchmarks/RESULTS.md §envs says why)
    cfg = load_config(EXAMPLE, [
        f"run_dir={run_dir}", f"model.path={tiny_model_path}", f"train.steps={STEPS}", "train.warm_start.steps=1",
        "domains.swe.max_turns=2", "domains.swe.max_new_tokens=64", "eval.every=100", "eval.episodes_per_domain=4",
        "observability.progress=quiet", "observability.tensorboard=false", f"reward.serverless.port={free_port()}",
    ])
    summary = train(cfg)
    assert summary["steps"] == STEPS and set(summary["eval_last_by_domain"]) == {"swe"}
    records: dict[int, dict] = {}
    for record in read_metrics(run_dir / "metrics.jsonl"):
        records.setdefault(record["step"], {}).update(record)
    assert records[0]["time/warm_start"] > 0  # the warm start ran before the first RL step
    last = records[max(records)]
    assert last["env/swe/resets"] >= STEPS * 8 and last["env/swe/resets_failed"] == 0
    assert last["env/swe/pool_hits"] + last["env/swe/pool_misses"] == last["env/swe/resets"]
    assert last["env/swe/pool_hits"] > 0  # the workers' pools were filled at placement
    # staged hits (a forecast group's env prepared with its task's files) are counted with the pool's hits; how
    # many there are depends on timing (a forecast must reach the pool before the group's resets do), so this
    # short run only checks the count is reported — tests/unit/test_envs_warm_pool.py and
    # test_envs_router_forecast.py check the staging itself
    assert 0 <= last["env/swe/pool_staged_hits"] <= last["env/swe/pool_hits"]
    assert all(0 < r["env/swe/reset_p50_s"] <= r["env/swe/reset_p99_s"] for r in records.values()
               if "env/swe/reset_p50_s" in r)
    assert last["buffer/ledger_violations"] == 0
    assert all(records[s]["env/swe/turns"] >= 1 for s in range(STEPS))  # the RL trajectories took turns
    page = build_report(run_dir).read_text()  # what `rollart train` writes at the end
    assert "<h2>Environment resets per domain</h2>" in page and "<th>swe</th>" in page
