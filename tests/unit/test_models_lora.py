"""LoRA adapters: the serving merge equals PEFT's own, an engine swap serves base + adapter, the trainer
trains and publishes only adapters and checkpoints them in PEFT's format."""

import copy

import pytest
import torch

from rollart.algo import PolicyObjective
from rollart.config import LoraConfig, RunConfig
from rollart.inference.builtin_engine import BuiltinEngine
from rollart.models import load_model
from rollart.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_of, attach_lora, merged_weights
from rollart.trainer import Trainer
from rollart.types import GenerationRequest, LoraAdapter, SamplingParams

from test_trainer_core import batch


def trained_like(base_path, seed: int, rank: int = 4):
    """A PEFT model on the base whose adapters are random (as if trained: B is no longer zero)."""
    torch.manual_seed(seed)
    model = attach_lora(load_model(base_path), LoraConfig(rank=rank, alpha=2.0 * rank))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return model


def peft_merged(peft_model) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in copy.deepcopy(peft_model).merge_and_unload().named_parameters()}


def test_the_serving_merge_equals_peft_merge_bit_for_bit(tiny_model_path):
    model = trained_like(tiny_model_path, seed=1)
    adapter = adapter_of(model)
    base = dict(load_model(tiny_model_path).named_parameters())
    mine = merged_weights({n: p.detach() for n, p in base.items()}, adapter)
    reference = peft_merged(model)
    assert len(mine) == 2 * 7  # 2 layers × 7 projections
    for name, w in mine.items():
        assert torch.equal(w, reference[name]), name
        assert not torch.equal(w, base[name]), name  # the adapter changed it


def test_an_engine_swap_serves_base_plus_adapter(tiny_model_path):
    """Float32 weights: merged weights equal PEFT's merge exactly, each version merged from the kept base
    (never base + v1 + v2), untouched weights stay the base's; the merged model's logits match PEFT's
    unmerged forward within 1e-5 (the only difference is float summation order)."""
    base = load_model(tiny_model_path)
    base_weights = {n: p.detach().clone() for n, p in base.named_parameters()}
    engine = BuiltinEngine(load_model(tiny_model_path), max_batch_size=4)
    ids = torch.tensor([[5, 17, 99, 3, 250, 7]])
    for version, seed in ((1, 1), (2, 2)):
        model = trained_like(tiny_model_path, seed)
        engine.swap_weights(version, adapter_of(model))
        served = dict(engine.model.named_parameters())
        reference = peft_merged(model)
        for name, w in served.items():
            assert torch.equal(w, reference[name]), (version, name)
        assert torch.equal(served["model.embed_tokens.weight"], base_weights["model.embed_tokens.weight"])
        with torch.no_grad():
            unmerged = model.eval()(input_ids=ids).logits
            merged = engine.model(input_ids=ids).logits
        torch.testing.assert_close(merged, unmerged, rtol=1e-5, atol=1e-5)
        assert engine.version == version
    # it still generates, and a full-weights update replaces the base adapters are merged into
    engine.add(GenerationRequest("r0", "t0", "d", (5, 17, 99), SamplingParams(max_new_tokens=3, temperature=0.0,
                                                                          ignore_eos=True)))
    results = []
    while engine.has_work():
        results += engine.step()
    assert len(results) == 1 and results[0].versions == (2, 2, 2)
    engine.swap_weights(3, base_weights)
    assert all(torch.equal(p, base_weights[n]) for n, p in engine.model.named_parameters())
    engine.swap_weights(4, adapter_of(trained_like(tiny_model_path, seed=1)))
    assert torch.equal(dict(engine.model.named_parameters())["model.layers.0.self_attn.q_proj.weight"],
                       peft_merged(trained_like(tiny_model_path, seed=1))["model.layers.0.self_attn.q_proj.weight"])


def test_a_merge_prepared_off_the_engine_thread_swaps_in_as_the_same_weights(tiny_model_path):
    """prepare_weights merges while the engine would be generating; the swap then only assigns. A merge
    prepared on a base that a full-weights update has since replaced is redone on the new base."""
    engine = BuiltinEngine(load_model(tiny_model_path), max_batch_size=4)
    adapter = adapter_of(trained_like(tiny_model_path, seed=1))
    prepared = engine.prepare_weights(adapter)
    base = dict(load_model(tiny_model_path).named_parameters())
    assert engine.version == 0  # preparing changed nothing served
    assert all(torch.equal(p, base[n]) for n, p in engine.model.named_parameters())
    engine.swap_weights(1, prepared)
    reference = peft_merged(trained_like(tiny_model_path, seed=1))
    assert all(torch.equal(p, reference[n]) for n, p in engine.model.named_parameters())
    # a full-weights update (new base) lands between a prepare and its swap: the stale merge is redone
    stale = engine.prepare_weights(adapter_of(trained_like(tiny_model_path, seed=2)))
    new_base = {n: p + 0.01 for n, p in load_model(tiny_model_path).named_parameters()}
    engine.swap_weights(2, new_base)
    engine.swap_weights(3, stale)
    expected = merged_weights(new_base, adapter_of(trained_like(tiny_model_path, seed=2)))
    for name, p in engine.model.named_parameters():
        assert torch.equal(p, expected.get(name, new_base[name])), name
    assert engine.prepare_weights(new_base) is new_base  # full weights: nothing to prepare


def test_an_adapter_the_merge_does_not_support_is_refused(tiny_model_path):
    adapter = adapter_of(trained_like(tiny_model_path, seed=1))
    engine = BuiltinEngine(load_model(tiny_model_path), max_batch_size=4)
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    with pytest.raises(ValueError, match="DoRA"):
        engine.swap_weights(1, LoraAdapter({**adapter.config, "use_dora": True}, adapter.tensors))
    assert engine.version == 0 and all(torch.equal(p, before[n]) for n, p in engine.model.named_parameters())


def test_a_lora_trainer_trains_and_publishes_only_adapters(tiny_model_path, tmp_path):
    cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"lora": {"rank": 4}, "lr": 1e-2})
    trainer = Trainer(cfg, PolicyObjective.of(cfg))
    base = {n: p.detach().clone() for n, p in load_model(tiny_model_path).named_parameters()}
    first = LoraAdapter(trainer.published_weights().config,
                        {n: t.clone() for n, t in trainer.published_weights().tensors.items()})
    trainer.train_step(batch(version=0))
    trainer.train_step(batch(version=1))
    published = trainer.published_weights()
    assert isinstance(published, LoraAdapter) and set(published.tensors) == set(first.tensors)
    assert all(".lora_A." in n or ".lora_B." in n for n in published.tensors)
    assert published.config["r"] == 4 and published.config["lora_alpha"] == 16.0
    assert any(not torch.equal(published.tensors[n], first.tensors[n]) for n in first.tensors)  # it trained
    full_bytes = sum(t.numel() * t.element_size() for t in base.values())
    assert published.nbytes * 10 < full_bytes
    weights = trainer.state_dict()  # by checkpoint name: the base's own names, PEFT's for the adapters
    for name, t in base.items():  # the base is frozen
        assert torch.equal(weights[name], t), name
    # checkpoint: a PEFT adapter directory that PEFT loads on the base, and that the trainer resumes from
    trainer.save(tmp_path / "ckpt", {})
    assert (tmp_path / "ckpt" / ADAPTER_CONFIG).is_file() and (tmp_path / "ckpt" / ADAPTER_WEIGHTS).is_file()
    assert not (tmp_path / "ckpt" / "model.safetensors").exists()
    from peft import PeftModel

    loaded = adapter_of(PeftModel.from_pretrained(load_model(tiny_model_path), str(tmp_path / "ckpt")))
    assert all(torch.equal(loaded.tensors[n], published.tensors[n]) for n in published.tensors)
    resumed = Trainer(cfg, PolicyObjective.of(cfg))
    resumed.load(tmp_path / "ckpt")
    again = resumed.published_weights().tensors
    assert resumed.version == 2 and all(torch.equal(again[n], published.tensors[n]) for n in published.tensors)
