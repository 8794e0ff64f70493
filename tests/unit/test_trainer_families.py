"""Any causal LM packs: a tiny random model of each family people train, built from transformers' own config class
and saved as a checkpoint — Llama (and SmolLM2, which is Llama), SmolLM3, Mistral (a sliding window shorter than
the samples), Qwen2 (sliding layers), Qwen3, Gemma, Gemma 2 (attention and final-logit soft-capping), Gemma 3
(sliding layers), Phi, Phi-3 — gives one train step's loss packed as padded within 1e-5, the log-probabilities of
the model's own eager forward on each sample alone, and trains 2 steps packed; an architecture that cannot pack is
refused when it loads, naming train.packing=false. Three samples of the batch share a prompt (packed, it is computed
once: trainer/packing.py), longer than the sliding windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from rollart.algo import PolicyObjective
from rollart.config import RunConfig
from rollart.trainer import Trainer
from rollart.trainer.attention import packing_problem
from rollart.trainer.packing import collate
from rollart.types import TrainBatch, TrainSample

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
FAMILIES = {
    "llama": ("LlamaConfig", dict(num_key_value_heads=2)),
    "smollm3": ("SmolLM3Config", dict(num_key_value_heads=2)),
    "mistral": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=8)),
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                                  max_window_layers=1)),
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=16)),
    "gemma": ("GemmaConfig", dict(num_key_value_heads=2, head_dim=16)),
    "gemma2": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=16, sliding_window=8,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", dict(num_key_value_heads=2, head_dim=16, sliding_window=8)),
    "phi": ("PhiConfig", dict()),
    "phi3": ("Phi3Config", dict(num_key_value_heads=2)),
}


def checkpoint(family: str, tiny_model_path: Path, root: Path) -> Path:
    """A random model of `family` with the tiny model's tokenizer, saved as a Hugging Face checkpoint."""
    out = root / family
    if out.is_dir():
        return out
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_model_path))
    name, extra = FAMILIES[family]
    config = getattr(transformers, name)(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                                         tie_word_embeddings=False, **SMALL, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # lively weights: logits big enough that a missed soft-cap or mask shows
        for p in model.parameters():
            p.mul_(4.0) if p.dim() > 1 else None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def family_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("families")


def batch(version: int = 0) -> TrainBatch:
    samples = []
    for i, (n, k) in enumerate([(21, 6), (13, 5), (30, 11), (9, 3)]):  # longer and shorter than the windows
        ids = tuple((7 * i + 3 * j) % 900 + 3 for j in range(n))
        mask = (0,) * (n - k) + (1,) * k
        samples.append(TrainSample(f"s{i}", "g", "d", ids, mask, tuple(-6.5 * m for m in mask),
                                   tuple(0 if m else -1 for m in mask), advantage=(-1) ** i * 0.8, reward=0.0))
    prompt = samples[0].token_ids[:15]  # two more answers to s0's prompt: packed, the three share it
    for i, own in enumerate([(41, 42, 43, 44, 45, 46), (51, 52, 53, 54)]):
        mask = (0,) * 15 + (1,) * len(own)
        samples.append(TrainSample(f"p{i}", "g", "d", prompt + own, mask, tuple(-6.5 * m for m in mask),
                                   tuple(0 if m else -1 for m in mask), advantage=0.3 - i, reward=0.0))
    return TrainBatch(version, tuple(samples))


def trainer(path: Path, packing: bool) -> Trainer:
    cfg = RunConfig(model={"path": str(path)}, train={"strategy": "ddp", "packing": packing, "micro_batch_tokens": 80})
    return Trainer(cfg, PolicyObjective.of(cfg))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_packs_as_it_pads_and_trains_two_steps(family: str, tiny_model_path: Path,
                                                              family_root: Path) -> None:
    path = checkpoint(family, tiny_model_path, family_root)
    padded, packed = trainer(path, False), trainer(path, True)
    from safetensors import safe_open

    from rollart.trainer.policy import entries

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    published = {n for e in entries(packed.policy, lora=False) if e.tensor.is_floating_point() for n in e.names}
    assert published and published <= saved, sorted(published - saved)  # the weights it publishes are the model's
    m_padded, m_packed = padded.train_step(batch(0)), packed.train_step(batch(0))
    assert m_padded["train/loss"] != 0 and abs(m_padded["train/loss"] - m_packed["train/loss"]) <= 1e-5, family
    assert m_packed["train/padding"] == 0 < m_padded["train/padding"]
    second = packed.train_step(batch(1))  # a second step, packed
    assert torch.isfinite(torch.tensor(second["train/loss"])) and second["train/loss"] != m_packed["train/loss"]


@pytest.mark.parametrize("family", ["gemma2", "mistral", "llama"])
def test_packed_log_probabilities_are_the_models_own_on_each_sample_alone(family: str, tiny_model_path: Path,
                                                                         family_root: Path) -> None:
    """The oracle is the model's own eager forward, one sample at a time: attention soft-capping, the final-logit
    soft-cap and the sliding window all agree."""
    path = checkpoint(family, tiny_model_path, family_root)
    t = trainer(path, True)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    samples = list(batch().samples)
    packed = collate(samples, t.pad_id, packed=True)
    assert packed.branches is not None and int(packed.branches.max()) == 3  # s0, p0 and p1 share their prompt
    with torch.no_grad():
        mine = t._logprobs(t.policy, packed, entropy=False)[0]
        for row, s in enumerate(samples):
            ids = torch.tensor([s.token_ids])
            logp = reference(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
            trained = torch.tensor(s.loss_mask[1:]).bool()
            theirs = logp.gather(1, ids[0, 1:, None])[:, 0][trained]
            ours = mine[row, : len(s.token_ids) - 1][trained]  # (the [b, L − 1] label layout)
            assert torch.allclose(ours, theirs, atol=2e-5), (family, row, (ours - theirs).abs().max())


def test_an_architecture_that_cannot_pack_is_refused_at_load_naming_the_switch(tmp_path: Path,
                                                                              tiny_model_path: Path) -> None:
    lfm2 = transformers.Lfm2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, layer_types=["conv", "full_attention"])
    assert "conv layers, which mix tokens across the whole row" in packing_problem(lfm2, transformers.Lfm2ForCausalLM)
    bloom = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=2)
    assert "does not route its attention" in packing_problem(bloom, transformers.BloomForCausalLM)
    assert packing_problem(transformers.LlamaConfig(), transformers.LlamaForCausalLM) == ""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_model_path))
    out = tmp_path / "lfm2"
    lfm2.vocab_size = len(tokenizer)
    transformers.AutoModelForCausalLM.from_config(lfm2).save_pretrained(out)
    tokenizer.save_pretrained(out)
    with pytest.raises(ValueError, match=r"train.packing: .*set train.packing=false"):
        trainer(out, True)
    trainer(out, False)  # padded, it loads
    from rollart.config.loader import ConfigError
    from rollart.job.preflight import check_config

    cfg = RunConfig(model={"path": str(out)}, run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"train.packing: Lfm2ForCausalLM has conv layers.*set train.packing=false"):
        check_config(cfg)  # before anything starts
    check_config(RunConfig(model={"path": str(out)}, train={"packing": False}, run_dir=str(tmp_path / "run")))
