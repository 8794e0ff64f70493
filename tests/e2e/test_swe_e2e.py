"""A short real `rollart train` on the SWE repair domain (examples/swe/swe.yaml): the warm start on the
scripted expert's demonstrations, then RL steps whose trajectories run tools in workspace sandboxes taken
from the warm pool; the run completes and reports per-domain reset metrics in metrics.jsonl and the
report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_a_short_swe_run_warm_starts_trains_and_reports_resets(tmp_path):
    run = tmp_path / "swe"
    cmd = [sys.executable, "-m", "rollart.cli", "train", str(ROOT / "examples" / "swe" / "swe.yaml"),
           f"run_dir={run}", "train.steps=3", "train.warm_start.steps=4", "eval.every=100",
           "eval.episodes_per_domain=4", "observability.progress=plain", "observability.tensorboard=false"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"rollart train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and set(summary["eval_last_by_domain"]) == {"swe"}
    records: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        records.setdefault(rec["step"], {}).update(rec)
    last = records[max(records)]
    assert last["env/swe/resets"] >= 3 * 8 and last["env/swe/resets_failed"] == 0
    assert last["env/swe/pool_hits"] + last["env/swe/pool_misses"] == last["env/swe/resets"]
    assert last["env/swe/pool_hits"] > 0  # the workers' pools were filled at placement
    assert all(0 < r["env/swe/reset_p50_s"] <= r["env/swe/reset_p99_s"] for r in records.values()
               if "env/swe/reset_p50_s" in r)
    assert last["buffer/ledger_violations"] == 0 and last["env/swe/turns"] >= 1
    page = (run / "report" / "index.html").read_text()
    assert "<h2>Environment resets per domain</h2>" in page and "<th>swe</th>" in page
