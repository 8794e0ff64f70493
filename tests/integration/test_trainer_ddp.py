"""Two trainer ranks (the default strategy, fsdp2: sharded) equal one rank on the same global batch; the store
serves the trainer's exact weights, gathered from the shards bucket by bucket on two ranks.

The default `train.lr` (1e-4) is used: Adam's first step divides each gradient coordinate by its own
magnitude, so float32 reduction-order noise in near-zero coordinates shows up in the update; at lr 1e-4 it
stays below 1e-6 relative on the parameters (at lr 1e-3 it reaches ~4e-6, even between two micro-batch
splits in one process). The gradient norm and loss are compared too: they see any scaling mistake.
"""

import asyncio
import uuid

import pytest
import torch

from rollart.algo import PolicyObjective
from rollart.config import WeightsConfig
from rollart.trainer import TrainerRanks
from rollart.weights import WeightStore

from trainer_helpers import connect, rel_diff, synthetic_batch, trainer_config

pytestmark = pytest.mark.ray


def run(tiny_model_path, tmp_path, workers, micro_batch_tokens):
    cfg = trainer_config(tiny_model_path, tmp_path / f"w{workers}", workers=workers,
                         micro_batch_tokens=micro_batch_tokens)
    store = WeightStore(WeightsConfig(), name=f"ws-{uuid.uuid4().hex[:8]}")
    sub = store.subscriber()
    try:
        with TrainerRanks(cfg, connect(cfg), PolicyObjective.of(cfg), store.publisher()) as group:
            assert group.version == 0 and store.latest_version() == 0
            v0 = asyncio.run(sub.pull(0))
            before = group.weights()
            metrics = group.train_step(synthetic_batch(version=0, n=8))
            after = group.weights()
            v1 = asyncio.run(sub.pull(store.latest_version()))
            other = group.weights(rank=workers - 1)
        return before, after, metrics, v0, v1, other, sub.version
    finally:
        store.close()


def test_two_ranks_equal_one_rank_and_pulled_weights_are_the_trainers(ray_local, tiny_model_path, tmp_path):
    before1, after1, m1, v0, v1, _, version1 = run(tiny_model_path, tmp_path, 1, micro_batch_tokens=4096)
    before2, after2, m2, v0_2, v1_2, other2, version2 = run(tiny_model_path, tmp_path, 2, micro_batch_tokens=64)

    # published weights are bit-identical to the trainer's for their version (one rank, and two shards)
    assert version1 == version2 == 1
    for name, t in before1.items():
        assert torch.equal(v0[name], t), name
        assert torch.equal(v1[name], after1[name]), name
        assert torch.equal(v0_2[name], before2[name]) and torch.equal(v1_2[name], after2[name]), name

    # the step moved the weights far more than the tolerance, so the comparison can fail
    assert rel_diff(before1, after1) > 1e-3
    assert rel_diff(before1, before2) == 0.0
    # 2 ranks × several micro-batches == 1 rank × one micro-batch (≤ 1e-6 relative)
    assert rel_diff(after1, after2) <= 1e-6
    assert rel_diff(after2, other2) == 0.0  # ranks hold the same weights
    for key in ("train/loss", "train/grad_norm", "train/entropy", "train/iw_mean", "train/behaviour_kl"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-6, abs=1e-9), key
    assert m1["train/tokens"] == m2["train/tokens"] and m1["train/version"] == m2["train/version"] == 1
    assert m1["time/weights.publish"] > 0 and m1["train/iw_truncated_frac"] > 0  # the batch has off-policy tokens
