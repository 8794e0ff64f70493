"""Constrained decoding in the built-in engine (llguidance masks on a real tiny model's logits): whatever the
random model prefers, what it samples under a JSON-schema grammar is valid JSON under the schema — a property
over random schemas from a small grammar of schemas — and the recorded logprobs are those of the masked
distribution."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.inference.builtin_engine import BuiltinEngine
from rollart.types import GenerationRequest, SamplingParams

COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from rollart.models import load_model, load_tokenizer

    torch.set_num_threads(1)
    return BuiltinEngine(load_model(tiny_model_path), load_tokenizer(tiny_model_path), max_batch_size=8)


def json_grammar(schema: dict) -> str:
    return "start: %json" + json.dumps({**schema, "x-guidance": COMPACT})


# --- a small grammar of schemas -------------------------------------------------------------------------
names = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
leaves = st.one_of(
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 100)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda values: {"enum": values}, st.lists(st.text("xyz", min_size=1, max_size=3), min_size=1,
                                                        max_size=3, unique=True)),
)


def objects(children):
    return st.dictionaries(names, children, min_size=1, max_size=3).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props),
                       "additionalProperties": False})


schemas = st.recursive(leaves, lambda children: st.one_of(
    objects(children),
    st.builds(lambda item, n: {"type": "array", "items": item, "maxItems": n}, children, st.integers(0, 3)),
), max_leaves=6).filter(lambda s: s.get("type") in ("object", "array")) | objects(leaves)


def run(engine, requests):
    for request in requests:
        engine.add(request)
    results = {}
    for _ in range(5000):
        if not engine.has_work():
            return results
        for r in engine.step():
            results[r.request_id] = r
    raise AssertionError("the engine did not finish")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=schemas, seed=st.integers(0, 2**31))
def test_sampling_under_a_json_schema_always_gives_valid_json(engine, schema, seed):
    tokenizer = engine.tokenizer
    eos = tokenizer.eos_token_id
    grammar = json_grammar(schema)
    requests = [GenerationRequest(f"p{seed}/{i}", f"p{seed}/{i}", "d", (5, 6, 7, 8),
                                  SamplingParams(temperature=1.0, max_new_tokens=400, seed=seed + i,
                                                 stop_token_ids=(eos,), grammar=grammar))
                for i in range(4)]
    for result in run(engine, requests).values():
        assert result.finish_reason == "stop", (schema, tokenizer.decode(list(result.token_ids)))
        assert result.token_ids[-1] == eos  # the stop token came where the grammar accepts, and only there
        value = json.loads(tokenizer.decode(list(result.token_ids[:-1])))
        jsonschema.validate(value, schema)
        assert all(lp <= 1e-6 and math.isfinite(lp) for lp in result.logprobs)


def test_logprobs_are_those_of_the_masked_distribution(engine, tiny_model_path):
    """A grammar that allows exactly one next token gives it logprob 0 (probability 1 under the mask), greedy
    or sampled; unconstrained the same token has a lower logprob."""
    tokenizer = engine.tokenizer
    forced = tokenizer.encode("yes", add_special_tokens=False)
    grammar = 'start: "yes"'
    eos = tokenizer.eos_token_id
    out = run(engine, [
        GenerationRequest("g", "g", "d", (9, 10), SamplingParams(temperature=0.0, max_new_tokens=20,
                                                                 stop_token_ids=(eos,), grammar=grammar)),
        GenerationRequest("s", "s", "d", (9, 10), SamplingParams(temperature=1.0, seed=3, max_new_tokens=20,
                                                                 stop_token_ids=(eos,), grammar=grammar)),
        GenerationRequest("f", "f", "d", (9, 10), SamplingParams(temperature=0.0, max_new_tokens=1)),
    ])
    for rid in ("g", "s"):
        assert tokenizer.decode(list(out[rid].token_ids[:-1])) == "yes" and out[rid].token_ids[-1] == eos
        assert all(abs(lp) < 1e-5 for lp in out[rid].logprobs[: len(forced)])
    assert engine.stats()["constrained_tokens"] > 0


def test_a_grammar_that_does_not_compile_is_refused_by_name(engine):
    with pytest.raises(ValueError, match="sampling.grammar"):
        engine.add(GenerationRequest("bad", "bad", "d", (1, 2), SamplingParams(grammar="start: %json{not json")))
    with pytest.raises(ValueError, match="sampling.grammar"):
        engine.add(GenerationRequest("empty", "empty", "d", (1, 2), SamplingParams(grammar="  ")))
