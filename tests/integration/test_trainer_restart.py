"""Trainer ranks that lose a rank (SIGKILL) on the shared test Ray.

- Idle: the health check notices within `cluster.health_interval_s`, the other rank is killed at once;
  the next call rebuilds the group from the latest checkpoint and replays the steps since — the weights
  are the lost group's bit for bit, and the store's newest versions (whose buckets died with the old
  rank 0) are pullable again.
- During a collective, past `train.restarts`: the call fails with `TrainerFailed` within seconds (no rank
  waits out the gloo timeout, `train.timeout_s` = 600 s here) and no rank survives.
- A save that fails removes its temporary directory; one a kill left behind is removed at the rebuild.
"""

from __future__ import annotations

import asyncio

import os
import signal
import time
import uuid

import psutil
import pytest
import torch
from testutil import wait_until

from rollart.algo import PolicyObjective
from rollart.config import WeightsConfig
from rollart.trainer import TrainerFailed, TrainerRanks, list_checkpoints
from rollart.trainer.checkpoint import checkpoints_root
from rollart.weights import WeightStore

from trainer_helpers import connect, synthetic_batch, trainer_config

pytestmark = pytest.mark.ray

CONVERSATION = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": r"\boxed{4}"}]


def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_a_dead_rank_is_rebuilt_exactly_and_past_the_limit_the_group_fails_fast(ray_local, tiny_model_path, tmp_path):
    cfg = trainer_config(tiny_model_path, tmp_path / "run", workers=2, restarts=1, timeout_s=600)
    cfg.cluster.health_interval_s = 0.5
    store = WeightStore(WeightsConfig(), name=f"ws-{uuid.uuid4().hex[:8]}")
    group = TrainerRanks(cfg, connect(cfg), PolicyObjective.of(cfg), store.publisher())
    try:
        group.sft_step([CONVERSATION] * 4)                        # v0 → v1
        group.train_step(synthetic_batch(version=1, seed=1))      # → v2
        saved = group.save_checkpoint(1, {"step": 1})             # checkpoint at v2, named by its RL step
        group.train_step(synthetic_batch(version=2, seed=2))      # → v3 (replayed after the rebuild)
        group.train_step(synthetic_batch(version=3, seed=3))      # → v4
        lost = group.weights()
        assert store.latest_version() == 4

        with pytest.raises(Exception):  # an extra state that cannot be written: the save fails ...
            group.save_checkpoint(3, {"unwritable": lambda: None})
        leftover = checkpoints_root(cfg.run_dir) / ".step_00000003.tmp-0123abcd"  # ... and a kill's leftover
        leftover.mkdir()
        assert {p.name for p in checkpoints_root(cfg.run_dir).iterdir()} == {saved.name, leftover.name}

        pids = group.pids()
        os.kill(pids[1], signal.SIGKILL)
        wait_until(lambda: _gone(pids), "the health check to notice and kill the other rank", timeout_s=15)
        rebuilt = group.weights()  # the next call rebuilds: checkpoint v2 + two replayed steps
        assert group.restarts == 1 and group.version == 4 and store.latest_version() == 4
        pulled = asyncio.run(store.subscriber().pull(4))  # the dead rank 0's buckets were published again
        for name, tensor in lost.items():
            assert torch.equal(rebuilt[name], tensor), name
            assert torch.equal(pulled[name], tensor), name
        assert {p.name for p in checkpoints_root(cfg.run_dir).iterdir()} == {saved.name}
        assert list_checkpoints(cfg.run_dir) == [saved]

        pids = group.pids()
        os.kill(pids[1], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(TrainerFailed, match=r"trainer rank trainer/test_a/\d died .*train\.restarts=1"):
            group.train_step(synthetic_batch(version=4, seed=4))  # rank 0 would block in the all-reduce
        assert time.monotonic() - start < 60
        wait_until(lambda: _gone(pids), "every rank to be gone", timeout_s=15)
    finally:
        group.close()
        store.close()
