"""A single-process Trainer: micro-batch split invariance, version checks, SFT on assistant tokens only."""

import pytest
import torch

from rollart.algo import PolicyObjective
from rollart.config import RunConfig
from rollart.trainer import Trainer
from rollart.trainer.sft_data import conversation_sample
from rollart.types import TrainBatch, TrainSample


def batch(version=0):
    samples = []
    for i, (n, k) in enumerate([(20, 6), (12, 4), (30, 10), (9, 3)]):
        ids = tuple((7 * i + 3 * j) % 900 + 3 for j in range(n))
        mask = (0,) * (n - k) + (1,) * k
        samples.append(TrainSample(f"s{i}", "g", "d", ids, mask, tuple(-6.5 * m for m in mask),
                                   tuple(0 if m else -1 for m in mask), advantage=(-1) ** i * 0.8, reward=0.0))
    return TrainBatch(version, tuple(samples))


def grads_after(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The (clipped) gradients of one step, captured just before the optimizer applies them."""
    captured = {}

    def capture(optimizer, args, kwargs):
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.register_step_pre_hook(capture)
    metrics = trainer.train_step(batch())
    return captured, metrics


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_micro_batch_split_does_not_change_the_gradient(tiny_model_path, aggregation):
    results = []
    for budget in (4096, 24):
        cfg = RunConfig(model={"path": str(tiny_model_path)},
                        train={"micro_batch_tokens": budget, "aggregation": aggregation})
        results.append(grads_after(Trainer(cfg, PolicyObjective.from_config(cfg.train))))
    (g1, m1), (g2, m2) = results
    assert g1.keys() == g2.keys() and len(g1) > 10
    for name in g1:  # per tensor, relative in norm (single near-zero coordinates carry float32 noise)
        assert float((g2[name] - g1[name]).norm() / g1[name].norm()) <= 1e-5, name
    assert m2["train/loss"] == pytest.approx(m1["train/loss"], rel=1e-6)
    assert m1["train/version"] == 1 and m1["train/tokens"] == 23


def test_wrong_version_is_refused(tiny_model_path):
    cfg = RunConfig(model={"path": str(tiny_model_path)})
    trainer = Trainer(cfg, PolicyObjective.from_config(cfg.train))
    with pytest.raises(ValueError, match="TrainBatch.version=3 but the trainer holds version 0"):
        trainer.train_step(batch(version=3))


def test_sft_trains_assistant_tokens_and_lowers_their_loss(tiny_model_path):
    cfg = RunConfig(model={"path": str(tiny_model_path)})
    trainer = Trainer(cfg, PolicyObjective.from_config(cfg.train))
    conv = [{"role": "user", "content": "Move"}, {"role": "assistant", "content": r"\boxed{Left}"}]
    s = conversation_sample(trainer.tokenizer, conv)
    trained = trainer.tokenizer.decode([t for t, m in zip(s.token_ids, s.loss_mask) if m])
    assert trained == r"\boxed{Left}<|im_end|>"
    losses = [trainer.sft_step([conv] * 4)["sft/loss"] for _ in range(5)]
    assert losses[-1] < losses[0] * 0.7 and trainer.version == 5


def test_kl_to_the_initial_weights_is_zero_then_grows(tiny_model_path):
    cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"kl_coef": 0.1, "lr": 1e-3})
    trainer = Trainer(cfg, PolicyObjective.from_config(cfg.train))
    first = trainer.train_step(batch(version=0))
    second = trainer.train_step(batch(version=1))
    assert first["train/ref_kl"] == 0.0 and first["train/kl_loss"] == 0.0  # the reference is version 0
    assert second["train/ref_kl"] > 0.0 and second["train/kl_loss"] > 0.0
