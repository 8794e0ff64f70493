"""A domain whose agent always raises stops rollout within 30 s, with one message: the domain, the count and
the first error with its traceback — not a batch timeout, not a resume hint — and no asyncio "Task exception
was never retrieved" anywhere in the console (Ray's worker logs included)."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
USERENV = Path(__file__).parent / "userenv"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO rollart(?:\.\w+)*: (.*)$", re.MULTILINE)


def logged_at(text: str, message: str) -> datetime.datetime:
    for stamp, line in STAMP.findall(text):
        if line.startswith(message):
            return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"no log line starting {message!r}:\n{text[-4000:]}")


def test_an_agent_that_always_raises_stops_rollout_at_once_with_its_first_error(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollart.cli", "train", f"run_dir={run_dir}", "observability.progress=plain",
           "observability.tensorboard=false", "domains.frozenlake=null", "domains.math=null",
           "domains.puzzle.agent=broken_agent:run", "domains.puzzle.max_turns=2", "train.steps=20",
           "eval.episodes_per_domain=2", "eval.retries=0", "rollout.batch_size=8"]
    proc = subprocess.run(cmd, cwd=USERENV, capture_output=True, text=True, timeout=420,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    console = proc.stdout + proc.stderr
    assert proc.returncode == 1, console[-5000:]
    # within seconds of rollout starting (the first evaluation's end), not at rollout.get_batch_timeout_s
    started, stopped = logged_at(console, "eval after 0 steps"), logged_at(console, "rollout stops: domain puzzle")
    assert (stopped - started).total_seconds() <= 30, (started, stopped)
    message = proc.stderr[proc.stderr.index("rollart: training stopped: "):]
    assert "domain 'puzzle' is broken:" in message and "failed in its own code" in message
    assert "The first failure, in agent: agent raised BadRequestError" in message
    assert message.count("Traceback (most recent call last)") == 1 and "broken_agent.py" in message
    assert "Fix the agent of domains.puzzle" in message
    assert "resume=true" not in console and "get_batch_timeout_s" not in console and "just slow" not in console
    assert "never retrieved" not in console
    assert not (run_dir / "checkpoints").exists()  # nothing trained, nothing to resume
