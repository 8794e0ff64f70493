"""`rollart serve-reward` standalone: prints its URL, scores an authenticated request (raw, and through
`RewardRouter` on the `http` backend), refuses an anonymous one, and stops cleanly (exit 0) on Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rollart.config import DomainConfig, RunConfig
from rollart.reward import RewardRouter
from rollart.types import Task, Trajectory, Turn
from testutil import free_port

pytestmark = pytest.mark.slow



def test_serve_reward_standalone(tmp_path, monkeypatch):
    port = free_port()
    env = {**os.environ, "ROLLART_REWARD_TOKEN": "cli-token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollart.cli", "serve-reward", "--port", str(port), "cluster.num_cpus=2",
             "reward.serverless.min_replicas=1"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[2],
        )
    try:
        deadline = time.monotonic() + 120
        url = ""
        while not url and time.monotonic() < deadline and proc.poll() is None:
            for line in log.read_text().splitlines():
                if line.startswith("reward service: "):
                    url = line.split()[2]
            time.sleep(0.5)
        assert url == f"http://127.0.0.1:{port}/reward", log.read_text()[-2000:]
        payload = {"v": 1, "trajectory_id": "cli-1", "domain": "math", "task": {},
                   "turns": [{"action": "\\boxed{12}"}], "reference": {"answer": "12"}}
        with httpx.Client(timeout=60) as http:
            ok = http.post(url, json=payload, headers={"authorization": "Bearer cli-token"})
            anon = http.post(url, json=payload)
        assert ok.status_code == 200 and ok.json()["reward"] == 1.0, ok.text
        assert anon.status_code == 401 and anon.json()["code"] == "unauthorized"
        assert "auth: Bearer token from $ROLLART_REWARD_TOKEN" in log.read_text()
        # a training job elsewhere: backend `http` to that URL, token from the same env var
        monkeypatch.setenv("ROLLART_REWARD_TOKEN", "cli-token")
        cfg = RunConfig(domains={"math": DomainConfig(env="math", reward={"fn": "math", "backend": "http"})})
        cfg.reward.http.url = url
        router = RewardRouter(cfg).start()
        traj = Trajectory("cli-2", Task("k", "math", "math", 0, "g"), 0, (Turn((), (), (), (), action="\\boxed{7}"),),
                          reference={"answer": "7"})
        result = asyncio.run(router.score(traj))
        router.stop()
        assert result.ok and result.reward == 1.0 and result.backend == "http", result
        assert router.metrics()["reward/http/requests"] == 1.0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, log.read_text()[-2000:]
    assert "stopping the reward service" in log.read_text()
    with pytest.raises(httpx.ConnectError):
        httpx.post(url, content=json.dumps(payload), timeout=5)
