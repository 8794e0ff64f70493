"""Checkpoints: exact resume (same next loss, same weights), HF format with tokenizer, extra state, keep K."""

import uuid

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollart.algo import PolicyObjective
from rollart.config import WeightsConfig
from rollart.trainer import TrainerRanks, latest_checkpoint, list_checkpoints
from rollart.weights import WeightStore

from trainer_helpers import connect, synthetic_batch, trainer_config

pytestmark = pytest.mark.ray

CONVERSATION = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": r"\boxed{4}"}]


def make_group(cfg, checkpoint=None):
    store = WeightStore(WeightsConfig(), name=f"ws-{uuid.uuid4().hex[:8]}")
    group = TrainerRanks(cfg, connect(cfg), PolicyObjective.of(cfg), store.publisher(),
                         checkpoint=checkpoint)
    return group, store


def test_resume_reproduces_the_next_step_exactly(ray_local, tiny_model_path, tmp_path):
    # cosine schedule with warm-up and an SFT step first: scheduler, both optimizers and the version matter
    cfg = trainer_config(tiny_model_path, tmp_path / "run", schedule="cosine", warmup_steps=1, steps=5,
                         keep_checkpoints=2)
    extra = {"sampler": {"next_seed": 17}, "buffer": [["t1", 0.5]]}  # JSON data
    group, store = make_group(cfg)
    try:
        group.sft_step([CONVERSATION] * 4)
        assert group.version == 1
        group.train_step(synthetic_batch(version=1, seed=1))
        first = group.save_checkpoint(1, extra)  # named by the RL step (1), not the version (2: the SFT step counts)
        group.train_step(synthetic_batch(version=2, seed=2))
        middle = group.save_checkpoint(2, extra)
        at_save = group.weights()
        expected = group.train_step(synthetic_batch(version=3, seed=3))
        expected_weights = group.weights()
        group.save_checkpoint(3, extra)
    finally:
        group.close()
        store.close()

    # keep_checkpoints=2: the newest two remain; `latest_checkpoint` is the newest
    assert [p.name for p in list_checkpoints(cfg.run_dir)] == ["step_00000002", "step_00000003"]
    assert latest_checkpoint(cfg.run_dir).name == "step_00000003" and not first.exists()

    resumed, store_r = make_group(cfg, checkpoint=middle)
    try:
        assert resumed.version == 3 and store_r.latest_version() == 3  # the restored version is published
        assert resumed.extra_state == extra
        restored = resumed.weights()
        got = resumed.train_step(synthetic_batch(version=3, seed=3))
        got_weights = resumed.weights()
    finally:
        resumed.close()
        store_r.close()

    for name in at_save:
        assert torch.equal(restored[name], at_save[name]), name
        assert torch.equal(got_weights[name], expected_weights[name]), name
    assert got["train/loss"] == expected["train/loss"]
    assert got["train/lr"] == expected["train/lr"] and got["train/grad_norm"] == expected["train/grad_norm"]

    # a Hugging Face checkpoint, with its tokenizer
    hf = AutoModelForCausalLM.from_pretrained(str(middle), local_files_only=True)
    for name, t in hf.state_dict().items():
        assert torch.equal(t, at_save[name]), name
    tok = AutoTokenizer.from_pretrained(str(middle), local_files_only=True)
    assert tok.apply_chat_template(CONVERSATION, tokenize=False).startswith("<|im_start|>user")
