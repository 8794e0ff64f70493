"""A job's life as a user ends it, in one process: Ctrl-C during the first evaluation stops `rollart train`
within seconds (exit 130, the resume command, no traceback), and the next job in the same process gets its
own embedded Ray and its own reward service on its configured address, and scores every episode.

On main before this: the second job in one process found Serve's cached client of the first (dead) Ray,
so its proxy bound Serve's default :8000 while the reward client called the configured port — every
serverless reward failed and the evaluation scored nothing; Ctrl-C in an evaluation printed
"_GatheringFuture exception was never retrieved" and a traceback.
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

# job a: `rollart train` (math only, no warm start), Ctrl-C'd by the test during its first evaluation;
# job b: an evaluation in the same process, on another reward port
TWO_JOBS = textwrap.dedent("""
    import json, sys
    from rollart.cli import main
    from rollart.config.loader import load_config
    from rollart.job.driver import evaluate

    base, port_a, port_b = sys.argv[1:4]
    math_only = ["domains.frozenlake=null", "observability.tensorboard=false"]
    rc = main(["train", f"run_dir={base}/a", f"reward.serverless.port={port_a}", "train.warm_start.steps=0",
               "eval.episodes_per_domain=512", "observability.progress=plain", *math_only])
    print(f"JOB a rc={rc}", flush=True)
    cfg = load_config(None, [f"run_dir={base}/b", f"reward.serverless.port={port_b}", "eval.episodes_per_domain=4",
                             "reward.outage_budget_s=30", *math_only])
    result = evaluate(cfg)
    print("JOB b", json.dumps({"scored": dict(result.scored), "failed": dict(result.failed)}), flush=True)
""")


def test_ctrl_c_stops_a_job_within_seconds_and_the_next_job_in_the_process_reaches_its_own_reward_service(tmp_path):
    (tmp_path / "two_jobs.py").write_text(TWO_JOBS)
    port_a, port_b = free_port(), free_port()
    with subprocess.Popen([sys.executable, str(tmp_path / "two_jobs.py"), str(tmp_path), str(port_a), str(port_b)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        seen: list[str] = []
        sent = stopped = None
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                seen.append(line)
                if sent is None and "evaluation first:" in line:  # its episodes are running
                    time.sleep(2.0)
                    sent = time.monotonic()
                    proc.send_signal(signal.SIGINT)
                elif line.startswith("JOB a rc="):
                    stopped = time.monotonic()
                    break
            assert sent is not None and stopped is not None, "".join(seen[-60:])
            rest = proc.communicate(timeout=300)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
    output = "".join(seen) + rest
    assert proc.returncode == 0, output[-5000:]
    assert seen[-1].strip() == "JOB a rc=130", output[-5000:]
    assert stopped - sent <= 10.0, f"{stopped - sent:.1f} s after SIGINT:\n{output[-5000:]}"
    assert "rollart: interrupted" in output and "resume=true" in output, output[-5000:]
    assert "Traceback" not in output and "exception was never retrieved" not in output, output[-5000:]
    # Serve's proxy came up on each job's configured port (not Serve's default :8000) ...
    assert f"is ready at http://127.0.0.1:{port_a}/" in output and f"is ready at http://127.0.0.1:{port_b}/" in output
    # ... and the second job scored every episode through it
    results = [json.loads(line.split(" ", 2)[2]) for line in rest.splitlines() if line.startswith("JOB b ")]
    assert results == [{"scored": {"math": 4}, "failed": {"math": 0}}], output[-5000:]


def test_ctrl_c_in_a_terminal_during_training_is_an_interrupt_not_a_death(tmp_path):
    """A terminal's Ctrl-C reaches the whole foreground process group — the driver and Ray's workers alike. The
    trainer ranks dying of it are the job stopping, not a failure: no "died … rebuilding the ranks" line, no
    replacement placed; the run ends interrupted (130) with the resume command."""
    cmd = [sys.executable, "-m", "rollart.cli", "train", f"run_dir={tmp_path / 'run'}", "train.warm_start.steps=0",
           "domains.frozenlake=null", "observability.tensorboard=false", "observability.progress=plain",
           "eval.episodes_per_domain=4", "train.steps=50", "train.checkpoint_every=1"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        seen: list[str] = []
        sent = None
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                seen.append(line)
                if sent is None and "step 2/50" in line:  # RL steps are running: the trainer ranks are busy
                    sent = time.monotonic()
                    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole process group
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    output = "".join(seen)
    assert sent is not None, output[-5000:]
    assert proc.returncode == 130, output[-5000:]
    assert "rollart: interrupted" in output and "resume=true" in output, output[-5000:]
    assert "died" not in output and "rebuilding" not in output and "placing a replacement" not in output, \
        output[-5000:]
