"""LoRA end to end, through the CLI as a user runs it: warm-start a base (`rollart model warm-start`), RL with
`train.lora` on it (only adapters sync), then `rollart eval` scores the run's LoRA checkpoint.

The base matters: the tiny model's random embeddings and output head are frozen under LoRA, so adapters
alone cannot teach it the action format (LoRA SFT of the bare tiny model stalls at a loss of ~4.5); a
user brings a trained model, and this test brings a warm-started one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollart.base.run_dir import RunPaths

from test_train_e2e import PICK, USERENV, metrics_by_step, rollart_train

pytestmark = [pytest.mark.slow]


def rollart(*args: str, timeout: int = 300) -> str:
    proc = subprocess.run([sys.executable, "-m", "rollart.cli", *args], cwd=USERENV, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"rollart {args[0]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_a_lora_run_raises_the_score_syncs_only_adapters_and_its_checkpoint_evaluates(tmp_path):
    base = tmp_path / "base"
    rollart("model", "warm-start", str(base), *PICK, "train.warm_start.steps=40")
    run = tmp_path / "lora"
    summary = rollart_train(
        run, *PICK, f"model.path={base}", "train.warm_start.steps=0", "train.lora.rank=8", "train.lr=3e-3",
        "train.steps=12", "rollout.batch_size=16", "eval.episodes_per_domain=32", "eval.temperature=1.0",
        "eval.every=100", cwd=USERENV,
    )
    assert summary["eval_last"] - summary["eval_first"] >= 0.25, summary
    m = metrics_by_step(run)
    full_mb = (base / "model.safetensors").stat().st_size / 2**20
    assert 0 < m[11]["weights/publish_mb"] < full_mb / 10  # adapter only: rank 8 of 2 layers ≈ 0.15 MB of 2.5
    checkpoint = RunPaths.of(run).checkpoints / "step_00000012"
    assert (checkpoint / "adapter_config.json").is_file() and not (checkpoint / "model.safetensors").exists()
    # the run's env class is code its config.yaml names: a run directory is data, so the user names it again
    scored = json.loads(rollart("eval", str(run), "domains.pick.env=pick_env:PickEnv").strip().splitlines()[-1])
    assert Path(scored["checkpoint"]).name == checkpoint.name  # the run's newest checkpoint
    assert set(scored["scores"]) == {"pick"}
    assert scored["mean"] - summary["eval_first"] >= 0.25, (scored, summary)
