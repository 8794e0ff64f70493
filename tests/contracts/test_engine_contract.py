"""The `InferenceEngine` contract (rollart/inference/protocol.py): every engine implementation passes these.

Add an engine by adding a factory to ENGINES (a vLLM engine would join here on a GPU machine).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rollart.inference.protocol import InferenceEngine
from rollart.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from rollart.models import load_model

    torch.set_num_threads(1)
    return load_model(tiny_model_path)


def _hf(model, **kw):
    from rollart.inference.hf_engine import HFEngine

    return HFEngine(copy.deepcopy(model), **kw)


ENGINES = {"hf": _hf}


@pytest.fixture(params=sorted(ENGINES))
def make_engine(request, model):
    return lambda **kw: ENGINES[request.param](model, **kw)


def _req(rid, n=40, traj=None, prompt=(5, 6, 7, 8), **kw):
    return GenerationRequest(rid, traj or f"traj-{rid}", "math", tuple(prompt),
                             SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True, **kw))


def _drain(engine, max_steps=1000):
    out = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        for r in engine.step():
            assert r.request_id not in out, "a request yielded two results"
            out[r.request_id] = r
    raise AssertionError("engine did not drain within the step bound")


def test_is_an_inference_engine(make_engine):
    assert isinstance(make_engine(), InferenceEngine)


def test_one_result_per_request_with_a_token_logprob_and_version_each(make_engine):
    engine = make_engine(max_batch_size=2)
    for i, n in enumerate([3, 9, 5, 1]):
        engine.add(_req(f"r{i}", n=n))
    out = _drain(engine)
    assert sorted(out) == ["r0", "r1", "r2", "r3"]
    for i, n in enumerate([3, 9, 5, 1]):
        r = out[f"r{i}"]
        assert r.finish_reason == "length" and len(r.token_ids) == n
        assert len(r.logprobs) == n and all(lp <= 0 for lp in r.logprobs) and r.versions == (0,) * n
        assert r.prompt_tokens == 4 and r.prefill_tokens == 4
        assert [s.name for s in r.spans] == ["generate"] and r.spans[0].end >= r.spans[0].start


def test_abort_running_frees_the_row_and_returns_tokens_so_far(make_engine):
    engine = make_engine()
    engine.add(_req("a", n=50))
    engine.add(_req("b", n=10))
    for _ in range(4):
        assert engine.step() == []
    assert engine.stats()["running"] == 2
    engine.abort("a")
    (aborted,) = engine.step()
    assert aborted.request_id == "a" and aborted.finish_reason == "abort"
    assert len(aborted.token_ids) == 4 and len(aborted.logprobs) == 4 and aborted.versions == (0,) * 4
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


def test_suspend_holds_queued_requests_but_running_ones_go_on(make_engine):
    engine = make_engine()
    engine.add(_req("running", n=6))
    engine.step()
    engine.suspend()
    engine.add(_req("held", n=3))
    out = _drain(engine)
    assert list(out) == ["running"] and engine.stats()["waiting"] == 1 and not engine.has_work()
    engine.resume()
    assert _drain(engine)["held"].finish_reason == "length"


def test_weight_update_keeps_running_requests_and_versions_move_forward(make_engine, model):
    engine = make_engine()
    engine.add(_req("r", n=12))
    for _ in range(5):
        engine.step()
    weights = {n: p.detach() * 1.01 for n, p in model.named_parameters()}
    engine.update_weights(7, weights)
    assert engine.version == 7
    r = _drain(engine)["r"]
    assert r.versions == (0,) * 5 + (7,) * 7
    with pytest.raises(ValueError, match="never go backwards"):
        engine.update_weights(6, weights)


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
