"""Forced tool calls and structured output through the gateway, generated for real: the built-in engine with a
tiny random model samples under the grammar the gateway builds (llguidance masks), the real `openai` client
parses what comes back. A random model writes what the grammar lets it: the point is that it can write
nothing else, and that the tokens recorded are the ones sampled."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import jsonschema
import openai
import pydantic
import pytest
import torch

from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.session import SessionLimits
from rollart.envs.chat import ChatTokens
from rollart.inference.builtin_engine import BuiltinEngine
from rollart.inference.engine_loop import EngineLoop
from rollart.types import GenerationRequest, GenerationResult, SamplingParams

CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 12}},
                   "required": ["expression"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search",
    "parameters": {"type": "object", "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 9}},
                   "required": ["k"], "additionalProperties": False}}}


class EngineClient:
    """The `LLMClient` an env worker gives its gateway, over one engine on its own thread."""

    def __init__(self, engine: BuiltinEngine) -> None:
        self.loop = EngineLoop(engine, "test")
        self.results: list[GenerationResult] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await self.loop.generate(request, 120.0)
        self.results.append(result)
        return result

    async def abort(self, trajectory_id: str) -> None:
        self.loop.abort_trajectory(trajectory_id)


class Served:
    def __init__(self, path) -> None:
        from rollart.models import load_model, load_tokenizer

        torch.set_num_threads(1)
        tokenizer = load_tokenizer(path)
        self.chat = ChatTokens(tokenizer)
        self.llm = EngineClient(BuiltinEngine(load_model(path), tokenizer, max_batch_size=8))
        self.gateway = AgentGateway(self.llm, self.chat).start()
        self.sampling = SamplingParams(temperature=1.0, max_new_tokens=96, stop_token_ids=self.chat.stop_token_ids)
        self.http = openai.DefaultHttpxClient()

    def open(self, tid: str) -> openai.OpenAI:
        base, key = self.gateway.open(tid, domain="agent", limits=SessionLimits(8, 2048), sampling=self.sampling,
                                      seed_for=lambda k: 7 + k)
        return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120, http_client=self.http)

    def turns(self, tid: str):
        session, failure = asyncio.run(self.gateway.finish(tid))
        assert not failure
        return session.turns


@pytest.fixture(scope="module")
def served(tiny_tool_model_path):
    s = Served(tiny_tool_model_path)
    yield s
    s.gateway.stop()
    s.llm.loop.close()


def test_tool_choice_required_always_gives_a_call_under_the_schema(served):
    client = served.open("req/0")
    for k in range(3):
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"go {k}"}],
                                               tools=[CALC, SEARCH], tool_choice="required",
                                               parallel_tool_calls=False)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        tool = {"calculator": CALC, "search": SEARCH}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    turns = served.turns("req/0")
    # the ids recorded are the ids the engine sampled under the mask
    assert [t.response_token_ids for t in turns] == [r.token_ids for r in served.llm.results[-3:]]
    assert all(t.format_ok for t in turns)


def test_a_named_tool_choice_calls_that_tool(served):
    client = served.open("named/0")
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                           tools=[CALC, SEARCH],
                                           tool_choice={"type": "function", "function": {"name": "search"}})
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "search" and 1 <= json.loads(call.function.arguments)["k"] <= 9
    responses = client.responses.create(
        model="m", input="y", tool_choice={"type": "function", "name": "calculator"},
        tools=[{"type": "function", "name": "calculator", "parameters": CALC["function"]["parameters"]}])
    assert [i.name for i in responses.output if i.type == "function_call"] == ["calculator"]
    served.turns("named/0")


class Answer(pydantic.BaseModel):
    verdict: bool
    count: int = pydantic.Field(ge=0, le=99)


def test_structured_output_parses_into_the_clients_model(served):
    client = served.open("json/0")
    parsed = client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "judge"}],
                                           response_format=Answer, max_tokens=64)
    assert isinstance(parsed.choices[0].message.parsed, Answer)
    obj = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "any"}],
                                         response_format={"type": "json_object"}, max_tokens=64)
    if obj.choices[0].finish_reason == "stop":  # a random model may fill 64 tokens with one long string
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    text = client.responses.parse(model="m", input="judge", text_format=Answer, max_output_tokens=64)
    assert isinstance(text.output_parsed, Answer)
    served.turns("json/0")


def test_a_schema_that_cannot_be_enforced_is_refused_by_name(served):
    client = served.open("bad/0")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "foo": {"$ref": "#/nope"},
                                                                          "properties": {"a": {"$ref": "#/nope"}}}}})
    assert err.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tool_choice="required")
    served.turns("bad/0")


def test_top_logprobs_come_from_the_engine(served):
    client = served.open("top/0")
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], logprobs=True,
                                           top_logprobs=5, max_tokens=8)
    content = reply.choices[0].logprobs.content
    result = served.llm.results[-1]
    assert len(content) == len(result.token_ids) - (result.token_ids[-1] in served.chat.stop_token_ids)
    for entry, token, top in zip(content, result.token_ids, result.top_logprobs):
        assert len(entry.top_logprobs) == 5
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and entry.logprob <= values[0] + 1e-6
        assert [t for t, _ in top] and entry.logprob == pytest.approx(dict(top).get(token, entry.logprob))
    served.turns("top/0")


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "glm45",
                                    "kimi_k2"])
def test_each_familys_forced_call_comes_back_as_tool_calls(served, family):
    """The engine writes a call in the family's format (its grammar) and the gateway parses it back: the round
    trip from grammar through sampling to parser, for every family, with each family's template."""
    import copy

    from rollart.config import GatewayConfig
    from tests.unit.tool_templates import template

    tokenizer = copy.deepcopy(served.chat.tokenizer)
    tokenizer.chat_template = template(family)
    gateway = AgentGateway(served.llm, ChatTokens(tokenizer), GatewayConfig(tool_parser=family)).start()
    try:
        # DeepSeek's markers are dozens of byte-level tokens each in the tiny tokenizer: room for a whole call
        sampling = dataclasses.replace(served.sampling, max_new_tokens=320)
        base, key = gateway.open(f"fam/{family}", domain="agent", limits=SessionLimits(4, 2048), sampling=sampling,
                                 seed_for=lambda k: 11 + k)
        client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120, http_client=served.http)
        # one call: a random model under "calls+" may go on writing calls until max_tokens (finish "length")
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}],
                                               tools=[CALC, SEARCH], tool_choice="required", parallel_tool_calls=False)
        calls = reply.choices[0].message.tool_calls
        assert calls and reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message.content
        for call in calls:
            tool = {"calculator": CALC, "search": SEARCH}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        session, _ = asyncio.run(gateway.finish(f"fam/{family}"))
        assert session.turns[0].format_ok
    finally:
        gateway.stop()
