"""A single-process Trainer: micro-batch split invariance, decoupled-PPO mini-batches, version checks, SFT on
assistant tokens only, the KL reference is the weights RL started from."""

import dataclasses

import pytest
import torch

from rollart.algo import PolicyObjective
from rollart.config import RunConfig
from rollart.models import load_model
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


def grads_after(trainer: Trainer, train_batch: TrainBatch | None = None):
    """The (clipped) gradients of every optimizer step of one train step, captured just before each is
    applied, and the step's metrics."""
    captured: list[dict[str, torch.Tensor]] = []

    def capture(optimizer, args, kwargs):
        captured.append({n: full(p.grad).clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.register_step_pre_hook(capture)
    metrics = trainer.train_step(train_batch or batch())
    return (captured[0] if len(captured) == 1 else captured), metrics


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP2-sharded) parameter or gradient."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def assert_same_grads(g1: dict[str, torch.Tensor], g2: dict[str, torch.Tensor], rel: float) -> None:
    assert g1.keys() == g2.keys() and len(g1) > 10
    for name in g1:  # per tensor, relative in norm (single near-zero coordinates carry float32 noise)
        assert float((g2[name] - g1[name]).norm() / g1[name].norm()) <= rel, name


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_micro_batch_split_does_not_change_the_gradient(tiny_model_path, aggregation):
    results = []
    for budget in (4096, 24):
        cfg = RunConfig(model={"path": str(tiny_model_path)},
                        train={"micro_batch_tokens": budget, "aggregation": aggregation})
        results.append(grads_after(Trainer(cfg, PolicyObjective.of(cfg))))
    (g1, m1), (g2, m2) = results
    assert_same_grads(g1, g2, 1e-5)
    assert m2["train/loss"] == pytest.approx(m1["train/loss"], rel=1e-6)
    assert m1["train/version"] == 1 and m1["train/tokens"] == 23


def test_wrong_version_is_refused(tiny_model_path):
    cfg = RunConfig(model={"path": str(tiny_model_path)})
    trainer = Trainer(cfg, PolicyObjective.of(cfg))
    with pytest.raises(ValueError, match="TrainBatch.version=3 but the trainer holds version 0"):
        trainer.train_step(batch(version=3))


def test_sft_trains_assistant_tokens_and_lowers_their_loss(tiny_model_path):
    cfg = RunConfig(model={"path": str(tiny_model_path)})
    trainer = Trainer(cfg, PolicyObjective.of(cfg))
    conv = [{"role": "user", "content": "Move"}, {"role": "assistant", "content": r"\boxed{Left}"}]
    s = conversation_sample(trainer.tokenizer, conv)
    trained = trainer.tokenizer.decode([t for t, m in zip(s.token_ids, s.loss_mask) if m])
    assert trained == r"\boxed{Left}<|im_end|>"
    losses = [trainer.sft_step([conv] * 4)["sft/loss"] for _ in range(5)]
    assert losses[-1] < losses[0] * 0.7 and trainer.version == 5


def test_one_mini_batch_gives_the_importance_weighted_policy_gradient(tiny_model_path):
    """mini_batches = epochs = 1 (the default) is one step of −Σ ω·m·min(π/μ, C)·A·∇log π, computed here by
    hand from a plain forward pass: what the trainer did before decoupled PPO had mini-batches."""
    from rollart.trainer.packing import collate

    # padded, like the forward by hand below (packed ≡ padded is its own test below)
    cfg = RunConfig(model={"path": str(tiny_model_path)},
                    train={"grad_clip": 1e9, "aggregation": "seq_mean", "packing": False})
    trainer = Trainer(cfg, PolicyObjective.of(cfg))
    grads, metrics = grads_after(trainer)
    assert metrics["train/updates"] == 1 and metrics["train/clip_frac"] == 0 and metrics["train/approx_kl"] == 0

    model = load_model(tiny_model_path, "float32", "cpu").train()
    mb = collate(batch().samples, trainer.pad_id)
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    m = mb.loss_mask
    omega = m / (m.sum(1, keepdim=True) * m.shape[0])  # seq_mean: every sample has model tokens
    iw = torch.exp(lp.detach() - mb.behaviour_logprobs).clamp(max=cfg.train.tis_cap)
    (-(omega * m * iw * mb.advantages[:, None] * lp).sum()).backward()
    by_hand = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert_same_grads(by_hand, grads, 1e-6)


@pytest.mark.parametrize("epochs", [1, 2])
def test_mini_batch_gradients_do_not_depend_on_micro_batching(tiny_model_path, epochs):
    """At a fixed mini-batch split, every optimizer step's gradient is the same whether the mini-batch runs
    as one micro-batch or many; the steps really are several and the later ones really are clipped PPO."""
    results = []
    for budget in (4096, 24):
        cfg = RunConfig(model={"path": str(tiny_model_path)},
                        train={"micro_batch_tokens": budget, "mini_batches": 2, "epochs": epochs, "lr": 1e-2})
        results.append(grads_after(Trainer(cfg, PolicyObjective.of(cfg)), big_batch()))
    (steps1, m1), (steps2, m2) = results
    assert len(steps1) == len(steps2) == 2 * epochs
    assert_same_grads(steps1[0], steps2[0], 1e-5)  # same weights: only the summation order differs
    # Later steps start from weights that differ by reduction-order noise, which Adam's per-coordinate
    # normalisation amplifies (see test_trainer_ddp); a wrong normalisation would be off by O(1).
    for g1, g2 in zip(steps1[1:], steps2[1:]):
        assert_same_grads(g1, g2, 1e-3)
    assert m1["train/updates"] == 2 * epochs and m1["train/version"] == 1  # one version per batch
    assert m1["train/approx_kl"] > 0 and m1["train/ratio_max"] > 1  # later steps moved off the proximal policy
    for key in ("train/loss", "train/clip_frac", "train/iw_mean", "train/approx_kl"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-9), key


def big_batch(n=16, version=0):
    """Enough samples for several mini-batches; behaviour logprobs near the model's (about −ln 1024)."""
    samples = []
    for i in range(n):
        length, k = 10 + (5 * i) % 17, 3 + i % 5
        ids = tuple((11 * i + 5 * j) % 900 + 3 for j in range(length))
        mask = (0,) * (length - k) + (1,) * k
        samples.append(TrainSample(f"s{i}", f"g{i // 4}", "d", ids, mask, tuple(-6.9 * m for m in mask),
                                   tuple(0 if m else -1 for m in mask), advantage=((-1) ** i) * (0.5 + i / n),
                                   reward=0.0))
    return TrainBatch(version, tuple(samples))


def test_the_kl_reference_is_the_weights_rl_started_from(tiny_model_path, tmp_path):
    """After a warm start (SFT steps) the reference is the warm-started weights, not the initial ones; a
    checkpoint keeps it, so a resumed run anchors to the same weights."""
    cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"kl_coef": 0.1, "lr": 1e-3})
    trainer = Trainer(cfg, PolicyObjective.of(cfg))
    conv = [{"role": "user", "content": "Move"}, {"role": "assistant", "content": r"\boxed{Left}"}]
    for _ in range(3):
        trainer.sft_step([conv] * 4)
    first = trainer.train_step(batch(version=3))
    second = trainer.train_step(batch(version=4))
    assert first["train/ref_kl"] == 0.0 and first["train/kl_loss"] == 0.0  # anchored at the warm-started weights
    assert second["train/ref_kl"] > 0.0 and second["train/kl_loss"] > 0.0
    trainer.save(tmp_path / "ckpt", {})
    resumed = Trainer(cfg, PolicyObjective.of(cfg))
    resumed.load(tmp_path / "ckpt")
    ref = dict(trainer.full_tensors(policy=trainer.ref_policy))
    back = dict(resumed.full_tensors(policy=resumed.ref_policy))
    assert ref.keys() == back.keys() and all(torch.equal(ref[k], back[k]) for k in ref)
    assert resumed.train_step(batch(version=5))["train/ref_kl"] > 0.0


def test_packed_rows_give_the_padded_loss_and_gradients(tiny_model_path):
    """Padding-free packing changes the layout, not the maths: loss and every gradient within 1e-5 (fp32)."""
    results = []
    for packing in (False, True):
        cfg = RunConfig(model={"path": str(tiny_model_path)},
                        train={"strategy": "ddp", "packing": packing, "micro_batch_tokens": 80})
        results.append(grads_after(Trainer(cfg, PolicyObjective.of(cfg)), big_batch()))
    (padded, m1), (packed, m2) = results
    assert abs(m1["train/loss"] - m2["train/loss"]) <= 1e-5 and m1["train/loss"] != 0
    assert_same_grads(padded, packed, 1e-5)
    assert max(float((padded[n] - packed[n]).abs().max()) for n in padded) <= 1e-5
    assert m2["train/padding"] == 0 < m1["train/padding"]


def group_batch(version=0):
    """Four prompts, four answers each (a GRPO batch): packed, each prompt is computed once for its group."""
    samples = []
    for g in range(4):
        prompt = tuple((13 * g + 7 * j) % 900 + 3 for j in range(14 + 3 * g))
        for m in range(4):
            own = tuple((5 * g + 11 * m + 3 * j) % 900 + 3 for j in range(2 + (g + m) % 4))
            mask = (0,) * len(prompt) + (1,) * len(own)
            samples.append(TrainSample(f"s{g}.{m}", f"g{g}", "d", prompt + own, mask, tuple(-6.9 * x for x in mask),
                                       tuple(0 if x else -1 for x in mask), advantage=(m - 1.5) / 2, reward=0.0))
    return TrainBatch(version, tuple(samples))


def test_a_prompt_shared_by_its_group_gives_the_padded_loss_and_gradients(tiny_model_path):
    results = []
    for packing in (False, True):
        cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"strategy": "ddp", "packing": packing})
        results.append(grads_after(Trainer(cfg, PolicyObjective.of(cfg)), group_batch()))
    (padded, m1), (shared, m2) = results
    assert abs(m1["train/loss"] - m2["train/loss"]) <= 1e-5 and m1["train/loss"] != 0
    assert_same_grads(padded, shared, 1e-5)
    prompts = sum(3 * (14 + 3 * g) for g in range(4))  # three of each group's four prompts are not computed
    total = sum(len(s.token_ids) for s in group_batch().samples)
    assert m2["train/prompt_reuse"] == pytest.approx(prompts / total) and m1["train/prompt_reuse"] == 0
    assert m2["train/padding"] == 0


def test_in_a_packed_row_no_sample_attends_to_another(tiny_model_path):
    from rollart.trainer.packing import collate

    cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"strategy": "ddp"})
    trainer = Trainer(cfg, PolicyObjective.of(cfg))
    a, b = batch().samples[0], batch().samples[2]
    other = dataclasses.replace(a, token_ids=tuple((t * 7 + 1) % 900 + 3 for t in a.token_ids))
    with torch.no_grad():
        alone = trainer._logprobs(trainer.policy, collate([b], trainer.pad_id, packed=True))[0][0]
        after_a = trainer._logprobs(trainer.policy, collate([a, b], trainer.pad_id, packed=True))[0][1]
        after_other = trainer._logprobs(trainer.policy, collate([other, b], trainer.pad_id, packed=True))[0][1]
    assert alone.abs().sum() > 0
    assert torch.allclose(after_a, alone, atol=1e-6) and torch.allclose(after_other, alone, atol=1e-6)


@pytest.mark.parametrize("switch", [{"activation_checkpointing": True}, {"offload": True}])
def test_memory_switches_do_not_change_the_gradient(tiny_model_path, switch):
    """Activation checkpointing recomputes each layer in the backward; offload keeps the shards in host
    memory: the same gradients either way (here on CPU, where offload moves nothing but runs its path)."""
    results, layer_calls = [], []
    for extra in ({}, switch):
        cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"strategy": "fsdp2", **extra})
        trainer = Trainer(cfg, PolicyObjective.of(cfg))
        calls = []
        trainer.model.model.layers[0].self_attn.register_forward_pre_hook(lambda *a: calls.append(1))  # inside the checkpoint
        results.append(grads_after(trainer, big_batch()))
        layer_calls.append(len(calls))
    (g1, m1), (g2, m2) = results
    assert_same_grads(g1, g2, 1e-6)
    if "activation_checkpointing" in switch:  # every layer forward ran again in the backward
        assert layer_calls[1] == 2 * layer_calls[0] > 0
    assert m2["train/loss"] == pytest.approx(m1["train/loss"], rel=1e-6)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fsdp2_frees_the_roots_gathered_weights_once_the_backward_passed_the_norm(tiny_model_path, monkeypatch,
                                                                                  checkpointing):
    """While the decoder layers run their backward the root's gathered embedding/head is freed (the module
    holds its shard again) — and the gradients are bit for bit those of a run that keeps it to the end."""
    import rollart.trainer.policy as policy_module
    from torch.distributed.tensor import DTensor

    results, seen = [], []
    for release in (True, False):
        if not release:
            monkeypatch.setattr(policy_module, "_release_point", lambda lm, layers: None)
        # (offload keeps FSDP2 on one rank — in float32 without it one rank trains the plain module, fsdp2.py —
        # and on CPU it moves nothing)
        cfg = RunConfig(model={"path": str(tiny_model_path)},
                        train={"strategy": "fsdp2", "activation_checkpointing": checkpointing, "offload": True})
        trainer = Trainer(cfg, PolicyObjective.of(cfg))
        assert trainer.policy.releases is release
        embed = trainer.model.get_input_embeddings()
        first = trainer.model.model.layers[0]
        during: list[bool] = []
        first.register_full_backward_pre_hook(lambda m, g: during.append(isinstance(embed.weight, DTensor)))
        results.append(grads_after(trainer, big_batch()))
        seen.append(during)
    assert seen[0] and all(seen[0])  # released in every micro-batch's backward before the first layer's
    assert seen[1] and not any(seen[1])
    (g1, m1), (g2, m2) = results
    assert g1.keys() == g2.keys() and all(torch.equal(g1[n], g2[n]) for n in g1)
    assert m1["train/loss"] == m2["train/loss"]


def test_one_fp32_rank_under_fsdp2_trains_the_plain_module_with_the_same_gradients(tiny_model_path):
    """One float32 rank has nothing to shard: fsdp2 leaves the module plain (no DTensor) — the gradients and loss
    are those of ddp's plain module bit for bit, and of the FSDP2 path (kept here by offload) within float32
    reduction order."""
    from torch.distributed.tensor import DTensor

    results = []
    for train in ({"strategy": "fsdp2"}, {"strategy": "ddp"}, {"strategy": "fsdp2", "offload": True}):
        cfg = RunConfig(model={"path": str(tiny_model_path)}, train=train)
        trainer = Trainer(cfg, PolicyObjective.of(cfg))
        sharded = any(isinstance(p, DTensor) for p in trainer.model.parameters())
        assert sharded is bool(train.get("offload")), train
        results.append(grads_after(trainer, big_batch()))
    (plain, m_plain), (ddp, m_ddp), (fsdp, m_fsdp) = results
    assert plain.keys() == ddp.keys() and all(torch.equal(plain[n], ddp[n]) for n in plain)
    assert m_plain["train/loss"] == m_ddp["train/loss"]
    assert_same_grads(plain, fsdp, 1e-6)


def test_packed_attention_batches_samples_of_one_length_as_padded_rows_would(tiny_model_path):
    """Many samples of few lengths (the packed row's attention runs once per length): the same gradients and
    loss as the padded layout, which attends row by row with a padding mask."""
    samples = [replace_tokens(s, 12 + (i % 3) * 5) for i, s in enumerate(big_batch(12).samples)]
    results = []
    for packing in (True, False):
        cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"packing": packing})
        results.append(grads_after(Trainer(cfg, PolicyObjective.of(cfg)), TrainBatch(0, tuple(samples))))
    (g1, m1), (g2, m2) = results
    assert_same_grads(g1, g2, 1e-5)
    # absolute: the loss (~0.04) is a sum of advantage-signed terms that nearly cancel, so float32's rounding in
    # the two layouts' different summation orders is relative to the terms, not to the sum (a full test run saw
    # 4.5e-8 apart, 1.1e-6 relative); a wrong mask or position moves it by orders of magnitude more
    assert m2["train/loss"] == pytest.approx(m1["train/loss"], abs=1e-6)


def replace_tokens(sample: TrainSample, length: int) -> TrainSample:
    """`sample` cut or stretched to `length` tokens, its last 3 the model's."""
    ids = tuple((sample.token_ids * 3)[:length])
    mask = (0,) * (length - 3) + (1,) * 3
    return dataclasses.replace(sample, token_ids=ids, loss_mask=mask, behaviour_logprobs=tuple(-6.9 * m for m in mask),
                               token_versions=tuple(0 if m else -1 for m in mask))
