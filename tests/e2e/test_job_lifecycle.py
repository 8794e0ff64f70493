"""A job's life as a user ends it: Ctrl-C stops `rollart train` within seconds, and one process can run job
after job (each gets its own embedded Ray and its own reward service on its configured address).

On main before this: the second job in one process found Serve's cached client of the first (dead) Ray,
so its proxy bound Serve's default :8000 while the reward client called the configured port — every
serverless reward failed and the evaluation scored nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from testutil import free_port

pytestmark = [pytest.mark.slow]

SHORT = ["domains.frozenlake=null", "eval.episodes_per_domain=4", "observability.progress=quiet",
         "reward.outage_budget_s=30"]  # math only, scored by the Serve reward service

TWO_JOBS = textwrap.dedent("""
    import json, sys
    from rollart.config_loader import load_config
    from rollart.driver import evaluate

    base, ports, overrides = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    for job, port in zip("ab", ports):
        cfg = load_config(None, [f"run_dir={base}/{job}", f"reward.serverless.port={port}", *overrides])
        result = evaluate(cfg)
        print("RESULT", job, json.dumps({"scored": dict(result.scored), "failed": dict(result.failed)}), flush=True)
""")


def test_two_jobs_in_one_process_each_reach_their_own_reward_service(tmp_path):
    (tmp_path / "two_jobs.py").write_text(TWO_JOBS)
    ports = [free_port(), free_port()]
    proc = subprocess.run([sys.executable, str(tmp_path / "two_jobs.py"), str(tmp_path), ",".join(map(str, ports)),
                           *SHORT], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = {job: json.loads(rest) for _, job, rest in
               (line.split(" ", 2) for line in proc.stdout.splitlines() if line.startswith("RESULT "))}
    # each evaluation scored every episode: its rewards came from the service on its own port
    assert results == {job: {"scored": {"math": 4}, "failed": {"math": 0}} for job in "ab"}, \
        proc.stdout[-3000:] + proc.stderr[-5000:]


def test_ctrl_c_during_the_first_evaluation_stops_train_within_seconds(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollart.cli", "train", f"run_dir={run}", "train.warm_start.steps=0",
           "eval.episodes_per_domain=256", "observability.progress=plain", "observability.tensorboard=false",
           f"reward.serverless.port={free_port()}"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        seen, sent = [], None
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                seen.append(line)
                if "evaluation first:" in line:  # the first evaluation has begun: its episodes are running
                    time.sleep(2.0)
                    sent = time.monotonic()
                    proc.send_signal(signal.SIGINT)
                    break
            assert sent is not None, "".join(seen[-40:])
            rest = proc.communicate(timeout=60)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
        took = time.monotonic() - sent
    output = "".join(seen) + rest
    assert proc.returncode == 130, output[-4000:]
    assert took <= 10.0, f"{took:.1f} s after SIGINT:\n{output[-4000:]}"
    assert "rollart: interrupted" in output and "resume=true" in output
    assert "Traceback" not in output and "exception was never retrieved" not in output, output[-4000:]
