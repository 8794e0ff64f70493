"""mini-swe-agent trains (examples/swe/mini_swe.yaml, made short): the warm start on its expert demonstrations
(mini-swe-agent's own prompts, the expert's bash calls), then 2 RL steps whose trajectories are mini-swe-agent's
own loop through the gateway, its commands in each trajectory's workspace sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "swe"


def test_mini_swe_agent_warm_starts_and_trains_two_steps(tmp_path):
    run = tmp_path / "mini"
    cmd = [sys.executable, "-m", "rollart.cli", "train", "mini_swe.yaml", f"run_dir={run}", "train.steps=2",
           "train.warm_start.steps=4", "eval.every=100", "eval.episodes_per_domain=4", "rollout.batch_size=8",
           "observability.progress=plain", "observability.tensorboard=false"]
    proc = subprocess.run(cmd, cwd=EXAMPLES, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and set(summary["eval_last_by_domain"]) == {"swe_mini"}
    records: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["step"], {}).update(record)
    for step in range(2):
        m = records[step]
        assert m["rollout/trajectories"] == 8 and m["env/swe_mini/turns"] >= 1 and m["train/tokens"] > 0
        assert m["buffer/ledger_violations"] == 0
