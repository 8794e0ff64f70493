"""Short real training runs (2 RL steps each, in process on the shared test Ray) of the environments users bring:

- the SWE domain with its workspaces in podman containers (`envs.workspace.backend=podman`), taken from the
  warm pool — containers are seen running during the run and none is left after it;
- an OpenEnv env (examples/openenv/guess_env, made from OpenEnv's template) whose server rollart starts;
- a verifiers environment (examples/verifiers/vf_reverse) played through each trajectory's gateway session.

The tiny model plays badly; what is checked is that each kind's trajectories run, end, are scored and train.
The podman case skips where podman or its image is missing, unless ROLLART_REQUIRE_CONTAINERS=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from testutil import free_port

from rollart.config.loader import load_config
from rollart.job.driver import train
from rollart.observability import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


def common(run_dir: Path, tiny_model_path) -> list[str]:
    return [f"run_dir={run_dir}", f"model.path={tiny_model_path}", f"train.steps={STEPS}", "eval.every=100",
            "eval.episodes_per_domain=4", "observability.progress=quiet", "observability.tensorboard=false",
            f"reward.serverless.port={free_port()}", "rollout.batch_size=8", "rollout.group_size=4"]


def by_step(run_dir: Path) -> dict[int, dict]:
    records: dict[int, dict] = {}
    for record in read_metrics(run_dir / "metrics.jsonl"):
        records.setdefault(record["step"], {}).update(record)
    return records


def swe_containers() -> list[str]:
    out = subprocess.run(["podman", "ps", "-a", "--filter", "label=rollart.owner=swe", "--format", "{{.Names}}"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.split()


def test_the_swe_domain_trains_in_podman_containers(ray_local, tiny_model_path, tmp_path):
    from tests.contracts.test_workspace_contract import _podman_missing

    missing = _podman_missing()
    if missing:
        if os.environ.get("ROLLART_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"ROLLART_REQUIRE_CONTAINERS=1 but {missing}")
        pytest.skip(missing)
    run_dir = tmp_path / "swe"
    cfg = load_config(ROOT / "examples" / "swe" / "swe.yaml", [
        *common(run_dir, tiny_model_path), "train.warm_start.steps=1", "domains.swe.max_turns=2",
        "domains.swe.max_new_tokens=64", "envs.workspace.backend=podman",
    ])
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            seen.update(swe_containers())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        summary = train(cfg)
    finally:
        done.set()
        watcher.join(timeout=30)
    assert summary["steps"] == STEPS
    records = by_step(run_dir)
    last = records[max(records)]
    assert last["env/swe/resets"] >= STEPS * 8 and last["env/swe/resets_failed"] == 0
    assert last["env/swe/pool_hits"] > 0 and all(records[s]["env/swe/turns"] >= 1 for s in range(STEPS))
    assert len(seen) >= 4  # the workspaces were containers (the pool alone holds 4)
    assert swe_containers() == []  # and none outlived the run


def rollart_train(example: str, run_dir: Path, *overrides: str) -> dict:
    """`rollart train run.yaml` in the example's directory (a fresh process: its Ray workers import the example's
    modules from there, as a user's would)."""
    cmd = [sys.executable, "-m", "rollart.cli", "train", "run.yaml", f"run_dir={run_dir}", f"train.steps={STEPS}",
           "eval.every=100", "eval.episodes_per_domain=4", "observability.progress=plain",
           "observability.tensorboard=false", "rollout.batch_size=8", "rollout.group_size=4", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT / "examples" / example, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"rollart train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads((run_dir / "summary.json").read_text())


def test_an_openenv_env_trains(tmp_path):
    run_dir = tmp_path / "openenv"
    summary = rollart_train("openenv", run_dir)
    assert summary["steps"] == STEPS and set(summary["eval_last_by_domain"]) == {"guess"}
    records = by_step(run_dir)
    for step in range(STEPS):
        assert records[step]["rollout/trajectories"] == 8 and records[step]["env/guess/turns"] >= 1
        assert records[step]["train/tokens"] > 0
    assert records[max(records)]["env/guess/resets_failed"] == 0


def test_a_verifiers_env_trains(tmp_path):
    run_dir = tmp_path / "verifiers"
    summary = rollart_train("verifiers", run_dir)
    assert summary["steps"] == STEPS and set(summary["eval_last_by_domain"]) == {"reverse"}
    records = by_step(run_dir)
    for step in range(STEPS):
        m = records[step]
        assert m["rollout/trajectories"] == 8 and m["env/reverse/turns"] == 1  # one model call per episode
        assert m["train/tokens"] > 0 and "env/reverse/agent/reward.similarity" in m
