"""A short real `rollart train` of the calculator-tool agent of examples/agents (written only against the
`openai` package), through the whole system: the scheduler admits agent trajectories, env workers serve
them through their gateway, the warm start uses the example's demonstrations, the trainer trains on the
recorded tokens, and every model call shows up as a turn in the metrics and the timeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def test_the_calculator_agent_example_trains_end_to_end(tmp_path):
    run = tmp_path / "calc"
    cmd = [sys.executable, "-m", "rollart.cli", "train", "calculator.yaml", f"run_dir={run}",
           "observability.progress=plain", "observability.tensorboard=false", "train.steps=3",
           "train.warm_start.steps=4", "rollout.batch_size=8", "eval.episodes_per_domain=4", "eval.every=100"]
    proc = subprocess.run(cmd, cwd=EXAMPLES, capture_output=True, text=True, timeout=420,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"rollart train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and set(summary["eval_last_by_domain"]) == {"calc"}
    records: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        records.setdefault(rec["step"], {}).update(rec)
    for step in range(3):
        m = records[step]
        assert m["rollout/trajectories"] == 8 and m["env/calc/turns"] >= 1
        assert m["train/tokens"] > 0 and m["train/seqs"] >= 8 and m["time/agent.step"] > 0
        assert "env/calc/malformed_tool_calls" in m and m["buffer/ledger_violations"] == 0
    names = {e.get("name") for e in json.loads((run / "timeline.json").read_text())["traceEvents"]}
    assert {"agent.step", "generate.wait"} <= names
