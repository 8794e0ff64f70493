"""Shared helpers of the trainer integration tests: configs on the test pools, synthetic batches."""

from __future__ import annotations

import random
import uuid

import torch

from rollart.config import PoolConfig, RoleConfig, RunConfig, default_pools
from rollart.types import TrainBatch, TrainSample


def trainer_config(tiny_model_path, run_dir, workers: int = 1, **train) -> RunConfig:
    """Trainers on the test pool `test_a` (capacity 2 in the shared test Ray) using the session's tiny model."""
    pools = {**default_pools(), "test_a": PoolConfig(kind="cpu", capacity=2)}
    return RunConfig(
        run_dir=str(run_dir),
        model={"path": str(tiny_model_path)},
        pools=pools,
        roles={"trainer": RoleConfig(pool="test_a")},
        train={"workers": workers, **train},
    )


def connect(cfg: RunConfig):
    """A ResourceManager of our own, so parallel test files never share a ledger."""
    from rollart.resources.placement import Resources

    return Resources.connect(cfg, name=f"rm-{uuid.uuid4().hex[:8]}")


def synthetic_batch(version: int, n: int = 8, seed: int = 0, vocab: int = 1000) -> TrainBatch:
    """Samples with a prompt, model tokens of mixed behaviour versions, varied lengths and advantages, and a
    reward of 0 or 1 (what a critic's GAE reads)."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        prompt, resp = rng.randint(4, 24), rng.randint(3, 20)
        ids = tuple(rng.randrange(3, vocab) for _ in range(prompt + resp))
        mask = (0,) * prompt + (1,) * resp
        beh = (0.0,) * prompt + tuple(rng.uniform(-8.0, -5.0) for _ in range(resp))
        vers = (-1,) * prompt + tuple(max(0, version - rng.randint(0, 1)) for _ in range(resp))
        advantage = rng.uniform(-1.5, 1.5)
        samples.append(TrainSample(f"t{seed}-{i}", f"g{i // 4}", "d", ids, mask, beh, vers, advantage=advantage,
                                   reward=float(i % 2)))  # (the critic's GAE reads the reward)
    return TrainBatch(version=version, samples=tuple(samples))


def rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over tensors of ‖a − b‖ / ‖a‖."""
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).norm() / a[k].double().norm().clamp(min=1e-30)) for k in a)
