"""`rollart train` killed with SIGKILL mid-run, then resumed with `resume=true`, as a user would: the resumed
run trains no scored group twice and drops none — the groups its checkpoint held scored but untrained are
trained as they were (same digest: not generated again), every trajectory the final ledger started ended
exactly once, and every step trains a full batch. The killed run's embedded Ray goes with it (its processes
are found by their RAY_TMPDIR and must be gone); the resume starts at once, in a Ray of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from raynodes import alive, kill_all, ours

from rollart.base.codec import from_json
from rollart.control.buffer import ReadyGroup
from rollart.control.ledger import trajectory_digest
from rollart.observability.ledger import audit_ledger
from rollart.trainer.checkpoint import latest_checkpoint, load_extra

pytestmark = [pytest.mark.slow]
STEPS, BATCH = 8, 8
# train.epochs=8: a train step (~2 s here) outlasts the rollout of the next batch, so every checkpoint before the
# last holds scored groups not trained yet (the driver lands each train step in the background and serves its
# weights at once; with one epoch, rollout was the slower side and the checkpoints were mostly empty: 1 in 6)
RUN = [f"train.steps={STEPS}", "train.epochs=8", "train.checkpoint_every=2", "train.warm_start.steps=4",
       f"rollout.batch_size={BATCH}", "eval.episodes_per_domain=4", "eval.every=100", "domains.frozenlake.max_turns=2",
       "observability.progress=plain", "observability.tensorboard=false", "cluster.num_cpus=2"]


def _steps_logged(run_dir) -> list[int]:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "time/step" in record:
            out.append(record["step"])
    return out


def _held_groups(run_dir) -> tuple[int, list]:
    """The step the run's newest checkpoint was taken before and the scored-but-untrained groups it holds
    ((-1, []) while there is none)."""
    checkpoint = latest_checkpoint(run_dir)
    try:
        extra = load_extra(checkpoint) if checkpoint else None
        return (extra["step"], list(extra["scheduler"]["ready"])) if extra else (-1, [])
    except (OSError, KeyError, TypeError, ValueError):  # being written: look again
        return -1, []


def _killable(run_dir) -> bool:
    """The newest checkpoint holds scored groups and a step after it is logged: work the kill loses."""
    step, held = _held_groups(run_dir)
    return bool(held) and max(_steps_logged(run_dir), default=-1) >= step


def test_a_driver_killed_with_sigkill_resumes_without_training_a_group_twice_or_dropping_one(
        tmp_path, tmp_path_factory):
    run_dir, ray_tmp = tmp_path / "run", tmp_path_factory.mktemp("rk")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "rollart.cli", "train", f"run_dir={run_dir}", *RUN]
    first = subprocess.Popen(cmd, env=env, stdout=open(tmp_path / "first.log", "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 420
        # past a checkpoint that holds scored-but-untrained groups, with work after it that the kill loses
        while not _killable(run_dir):
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first run did not log a step after a checkpoint holding a group"
            time.sleep(0.2)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        killed_at = time.monotonic()
    finally:
        if first.poll() is None:
            first.kill()
    leftovers = ours(ray_tmp)
    # The resume runs in a Ray of its own (another RAY_TMPDIR) at once, while the killed run's goes: the embedded
    # Ray shares the driver's fate, but Ray's own agents (DashboardAgent, RuntimeEnvAgent) first report the
    # raylet's death to the GCS — gone too — in a call Ray bounds at 60 s (ray._private.utils.
    # publish_error_to_driver), then exit; the resume takes about that long, so waiting first would double it.
    resume_tmp = tmp_path_factory.mktemp("rr")
    try:
        checkpoint = latest_checkpoint(run_dir)
        held = [from_json(ReadyGroup, g) for g in load_extra(checkpoint)["scheduler"]["ready"]]
        digests = {t.trajectory_id: trajectory_digest(t) for g in held for t in g.trajectories}

        resumed = subprocess.run([*cmd, "resume=true"], env={**env, "RAY_TMPDIR": str(resume_tmp)},
                                 capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        # the bound: the agents' 60 s call plus their pipe check and margin, counted from the kill's end
        deadline = killed_at + 90
        while alive(leftovers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alive(leftovers) == [], "the killed run's Ray outlived it"
    finally:
        kill_all(ours(ray_tmp))
        kill_all(ours(resume_tmp))

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS
    audit = audit_ledger(run_dir / "ledger.jsonl")
    assert audit.lost == () and audit.broken == (), (audit.lost, audit.broken)  # each ended once
    assert len(audit.trained) == STEPS * BATCH  # every step a full batch, none trained twice (ids are unique)
    assert digests, "the checkpoint held no scored group: the test would prove nothing"
    for trajectory_id, digest in digests.items():  # held at the checkpoint: trained after, as they were
        assert audit.trained[trajectory_id][1] == digest, trajectory_id
