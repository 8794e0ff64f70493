"""BuiltinEngine against transformers itself: greedy = `generate`, logprobs = a full-forward recompute, weight swaps
with KV recompute = a fresh request under the new weights, prefix reuse = no reuse but fewer prefill tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from rollart.inference.builtin_engine import BuiltinEngine
from rollart.inference.sampling import sampling_logprobs
from rollart.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from rollart.models import load_model

    torch.set_num_threads(1)
    return load_model(tiny_model_path)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from rollart.models import load_tokenizer

    return load_tokenizer(tiny_model_path)


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(3, 1000, (n,), generator=g).tolist()) for n in lengths]


def _req(i, prompt, traj=None, **sampling):
    return GenerationRequest(f"r{i}", traj or f"t{i}", "math", tuple(prompt), SamplingParams(**sampling))


def _drain(engine, results=None, max_steps=2000):
    results = {} if results is None else results
    for _ in range(max_steps):
        if not engine.has_work():
            return results
        for r in engine.step():
            results[r.request_id] = r
    raise AssertionError("engine did not finish within the step bound")


def _perturbed(model, scale=0.02, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {n: p.detach() + scale * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}


def test_greedy_equals_generate_with_requests_joining_and_leaving(model, tokenizer):
    prompts = _prompts([5, 9, 17, 3, 30, 12, 7])
    lengths = [20, 6, 33, 14, 25, 9, 18]
    engine = BuiltinEngine(model, tokenizer, max_batch_size=3)  # 7 requests through 3 rows: rows are reused
    for i in range(5):
        engine.add(_req(i, prompts[i], temperature=0.0, max_new_tokens=lengths[i]))
    results = {}
    for _ in range(4):  # two requests arrive mid-flight, between steps
        results.update({r.request_id: r for r in engine.step()})
    for i in (5, 6):
        engine.add(_req(i, prompts[i], temperature=0.0, max_new_tokens=lengths[i]))
    _drain(engine, results)
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=lengths[i])
        assert list(results[f"r{i}"].token_ids) == out[0, len(prompt):].tolist(), f"request {i} differs"
    assert engine.stats()["running"] == 0


def test_logprobs_equal_full_forward_recompute(model, tokenizer):
    prompts = _prompts([6, 11, 4])
    settings = [
        dict(temperature=0.0),
        dict(temperature=0.8, top_k=50, top_p=0.9, seed=1),
        dict(temperature=1.3, seed=2),
    ]
    engine = BuiltinEngine(model, tokenizer, max_batch_size=4)
    for i, (p, s) in enumerate(zip(prompts, settings)):
        engine.add(_req(i, p, max_new_tokens=12, **s))
    results = _drain(engine)
    with torch.no_grad():
        for i, (p, s) in enumerate(zip(prompts, settings)):
            r = results[f"r{i}"]
            full = torch.tensor([list(p) + list(r.token_ids)])
            logits = model(full).logits[0, len(p) - 1 : -1]
            lp = sampling_logprobs(logits, [SamplingParams(**s)] * len(r.token_ids))
            expected = lp.gather(1, torch.tensor(r.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(r.logprobs), expected, atol=1e-4), f"request {i}"
            assert r.versions == (0,) * len(r.token_ids)


def test_seeded_sampling_does_not_depend_on_batch_mates(model, tokenizer):
    prompt = _prompts([8])[0]
    solo = BuiltinEngine(model, tokenizer)
    solo.add(_req(0, prompt, temperature=1.0, seed=42, max_new_tokens=16))
    alone = _drain(solo)["r0"]
    crowd = BuiltinEngine(model, tokenizer)
    for i, p in enumerate(_prompts([3, 20, 9], seed=5), start=1):
        crowd.add(_req(i, p, temperature=1.0, max_new_tokens=30))
    crowd.step()
    crowd.add(_req(0, prompt, temperature=1.0, seed=42, max_new_tokens=16))
    together = _drain(crowd)["r0"]
    assert together.token_ids == alone.token_ids
    assert torch.allclose(torch.tensor(together.logprobs), torch.tensor(alone.logprobs), atol=1e-5)


def test_update_weights_recomputes_kv_and_stamps_new_version(model, tokenizer):
    m = copy.deepcopy(model)
    new_weights = _perturbed(m)
    prompt = _prompts([10])[0]
    engine = BuiltinEngine(m, tokenizer)
    engine.add(_req(0, prompt, temperature=0.0, max_new_tokens=20))
    engine.add(_req(1, _prompts([4], seed=3)[0], temperature=0.0, max_new_tokens=20))
    for _ in range(6):
        engine.step()
    engine.swap_weights(1, new_weights)
    result = _drain(engine)["r0"]
    assert result.versions == (0,) * 6 + (1,) * 14  # earlier tokens keep their version
    assert engine.stats()["recompute_tokens"] > 0

    fresh = BuiltinEngine(m, tokenizer, version=1)  # same (updated) model: a fresh request of prompt + prefix
    fresh.add(_req(9, prompt + result.token_ids[:6], temperature=0.0, max_new_tokens=14))
    again = _drain(fresh)["r9"]
    assert again.token_ids == result.token_ids[6:]
    assert torch.allclose(torch.tensor(again.logprobs), torch.tensor(result.logprobs[6:]), atol=1e-4)
    for name, value in new_weights.items():
        assert torch.equal(m.get_parameter(name), value)  # bit-identical weights


def test_update_weights_checks_names_shapes_and_versions(model, tokenizer):
    m = copy.deepcopy(model)
    engine = BuiltinEngine(m, tokenizer, version=2)
    weights = _perturbed(m)
    with pytest.raises(ValueError, match="version 2 is not newer than the served version 2"):
        engine.swap_weights(2, weights)
    with pytest.raises(ValueError, match="not in the model"):
        engine.swap_weights(3, {**weights, "bogus.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="missing"):
        engine.swap_weights(3, {k: v for k, v in weights.items() if "layers.0." not in k})
    name = next(iter(weights))
    with pytest.raises(ValueError, match=f"{name}.*shape"):
        engine.swap_weights(3, {**weights, name: torch.zeros(3, 3)})
    assert engine.version == 2
    engine.swap_weights(3, {k: v.numpy() for k, v in weights.items()})  # numpy arrays are accepted
    assert engine.version == 3


def _conversation(engine, turns, seed=0):
    """An 8-turn chat of one trajectory: each prompt = previous prompt + response + new observation."""
    obs = _prompts([6] * turns, seed=seed)
    prompt, outputs = obs[0], []
    for t in range(turns):
        engine.add(GenerationRequest(f"turn{t}", "traj", "math", prompt, SamplingParams(temperature=0.0, max_new_tokens=8)))
        r = _drain(engine)[f"turn{t}"]
        outputs.append(r)
        if t + 1 < turns:
            prompt = prompt + r.token_ids + obs[t + 1]
    return outputs


def test_prefix_reuse_gives_identical_outputs_with_fewer_prefill_tokens(model, tokenizer):
    with_reuse = _conversation(BuiltinEngine(model, tokenizer, prefix_cache_mb=16), turns=5)
    without = _conversation(BuiltinEngine(model, tokenizer, prefix_cache_mb=0), turns=5)
    for a, b in zip(with_reuse, without):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
        assert a.prompt_tokens == b.prompt_tokens
    assert with_reuse[0].prefill_tokens == without[0].prefill_tokens
    for a, b in zip(with_reuse[1:], without[1:]):
        # only the new observation and the last response token need computing
        assert a.prefill_tokens == 6 + 1 and b.prefill_tokens == b.prompt_tokens


def test_prefix_reuse_needs_the_same_weight_version(model, tokenizer):
    m = copy.deepcopy(model)
    engine = BuiltinEngine(m, tokenizer, prefix_cache_mb=16)
    first = _conversation(engine, turns=1)[0]
    engine.swap_weights(1, _perturbed(m))
    prompt = _prompts([6])[0] + first.token_ids + (5, 6, 7)
    engine.add(GenerationRequest("next", "traj", "math", prompt, SamplingParams(temperature=0.0, max_new_tokens=4)))
    assert _drain(engine)["next"].prefill_tokens == len(prompt)


def test_prefix_cache_lru_eviction_in_engine(model, tokenizer):
    # budget for about one trajectory's KV: 2 layers × (k, v) × 2 heads × 32 dims × 4 bytes = 1 KiB/token
    engine = BuiltinEngine(model, tokenizer, prefix_cache_mb=40 / 1024)
    for i in range(3):
        engine.add(_req(i, _prompts([20], seed=i)[0], traj=f"traj{i}", temperature=0.0, max_new_tokens=4))
    _drain(engine)
    stats = engine.stats()
    assert stats["prefix_entries"] == 1 and stats["prefix_evictions"] == 2
    assert stats["prefix_cache_mb"] <= 40 / 1024


def test_stop_token_ids_and_stop_strings(model, tokenizer):
    prompt = _prompts([7])[0]
    engine = BuiltinEngine(model, tokenizer, eos_token_ids=[])
    engine.add(_req(0, prompt, temperature=0.0, max_new_tokens=40))
    free = _drain(engine)["r0"]
    stop_tok = free.token_ids[5]
    first = free.token_ids.index(stop_tok)
    engine.add(_req(1, prompt, temperature=0.0, max_new_tokens=40, stop_token_ids=(stop_tok,)))
    stopped = _drain(engine)["r1"]
    assert stopped.token_ids == free.token_ids[: first + 1] and stopped.finish_reason == "stop"

    text = tokenizer.decode(free.token_ids[8:12])
    stop = text[len(text) // 2 :][:3] or text
    engine.add(_req(2, prompt, temperature=0.0, max_new_tokens=40, stop_strings=(stop,)))
    by_string = _drain(engine)["r2"]
    n = len(by_string.token_ids)
    assert by_string.finish_reason == "stop" and by_string.token_ids == free.token_ids[:n]
    assert stop in tokenizer.decode(by_string.token_ids) and stop not in tokenizer.decode(by_string.token_ids[:-1])
    assert free.finish_reason == "length" and len(free.token_ids) == 40


def test_concurrent_prefix_hits_share_one_forward_and_match_no_reuse(model, tokenizer):
    """Three trajectories continue at once with 3, 6 and 9 new tokens: one forward of width 10 serves them
    (rows with fewer new tokens recompute the difference), outputs equal a run without reuse."""

    def run(prefix_cache_mb):
        engine = BuiltinEngine(model, tokenizer, prefix_cache_mb=prefix_cache_mb)
        firsts = _prompts([12, 5, 20], seed=7)
        for i, p in enumerate(firsts):
            engine.add(GenerationRequest(f"a{i}", f"traj{i}", "math", p, SamplingParams(temperature=0.0, max_new_tokens=6)))
        first = _drain(engine)
        for i, (p, extra) in enumerate(zip(firsts, _prompts([3, 6, 9], seed=8))):
            prompt = p + first[f"a{i}"].token_ids + extra
            engine.add(GenerationRequest(f"b{i}", f"traj{i}", "math", prompt, SamplingParams(temperature=0.0, max_new_tokens=6)))
        return _drain(engine), engine.stats()

    reused, stats = run(16)
    plain, _ = run(0)
    for i in range(3):
        assert reused[f"b{i}"].token_ids == plain[f"b{i}"].token_ids
        assert torch.allclose(torch.tensor(reused[f"b{i}"].logprobs), torch.tensor(plain[f"b{i}"].logprobs), atol=1e-4)
        assert reused[f"b{i}"].prefill_tokens == 10 and plain[f"b{i}"].prefill_tokens == plain[f"b{i}"].prompt_tokens
    assert stats["prefix_hits"] == 3


def test_a_group_sharing_a_prompt_computes_it_once_and_samples_as_if_alone(model, tokenizer):
    """Four requests with one prompt (a GRPO group) and one other join in the same step: the prompt is
    computed once (its copies report 0 prefill tokens), and every request's tokens and logprobs are those it
    gets alone; greedy ones still equal `generate`."""
    shared, other = _prompts([9, 14], seed=3)
    settings = [dict(temperature=1.0, seed=s, max_new_tokens=10) for s in (1, 2, 3)]
    settings.append(dict(temperature=0.0, max_new_tokens=10))
    engine = BuiltinEngine(model, tokenizer)
    for i, s in enumerate(settings):
        engine.add(_req(i, shared, **s))
    engine.add(_req(9, other, temperature=0.0, max_new_tokens=10))
    together = _drain(engine)
    assert engine.stats()["prefill_rows_shared"] == 3
    assert [together[f"r{i}"].prefill_tokens for i in range(4)] == [len(shared), 0, 0, 0]
    assert together["r9"].prefill_tokens == len(other)
    for i, s in enumerate(settings):
        solo = BuiltinEngine(model, tokenizer)
        solo.add(_req(i, shared, **s))
        alone = _drain(solo)[f"r{i}"]
        assert together[f"r{i}"].token_ids == alone.token_ids, f"request {i}"
        assert torch.allclose(torch.tensor(together[f"r{i}"].logprobs), torch.tensor(alone.logprobs), atol=1e-4)
    assert len({together[f"r{i}"].token_ids for i in range(3)}) > 1  # the seeded copies sampled apart
    ids = torch.tensor([shared])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10)
    assert list(together["r3"].token_ids) == out[0, len(shared):].tolist()
