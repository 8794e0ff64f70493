"""The agent gateway through the real `openai` client, against a scripted LLM client (the point here is the
gateway: HTTP, OpenAI shapes, exact tokens, segments, tools, errors, cancellation — not generation).

The scripted LLM encodes each answer with the real tokenizer plus the stop token, as a sampled response
would be; every request it receives is kept, so the tests compare the gateway's recorded turns with the
very ids the "engine" saw and produced.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import openai
import pytest

from rollart.algo import build_train_batch
from rollart.config import GatewayConfig, TrainConfig
from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.session import SessionLimits
from rollart.envs.chat import ChatTokens
from rollart.models.tiny import build_tokenizer
from rollart.types import SamplingParams, Status, Task, Trajectory
from tests.unit.envs_fakes import ScriptedLLM

CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37*4"}}\n</tool_call>'


@pytest.fixture(scope="module")
def chat() -> ChatTokens:
    return ChatTokens(build_tokenizer(tool_calls=True))


_HTTP: list[object] = []  # one connection pool for every client of this module (building one costs ~0.1 s)


def http_client():
    if not _HTTP:
        _HTTP.append(openai.DefaultHttpxClient())
    return _HTTP[0]


class Harness:
    """A started gateway over a ScriptedLLM whose replies the test sets."""

    def __init__(self, chat: ChatTokens, cfg: GatewayConfig | None = None, delay_s: float = 0.0) -> None:
        self.replies: list[str] = []
        self.llm = ScriptedLLM(chat.tokenizer, lambda request, k: self.replies[k], delay_s=delay_s)
        self.chat = chat
        self.gateway = AgentGateway(self.llm, chat, cfg).start()
        self.sampling = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=chat.stop_token_ids)

    def open(self, tid: str, max_calls: int = 8, max_total_tokens: int = 1024, source: str = "run") -> openai.OpenAI:
        base, key = self.gateway.open(tid, domain="agent", limits=SessionLimits(max_calls, max_total_tokens),
                                      sampling=self.sampling, sampling_source=source, seed_for=lambda k: 100 + k)
        return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30, http_client=http_client())

    def finish(self, tid: str) -> Trajectory:
        session, failure = asyncio.run(self.gateway.finish(tid))
        assert not failure
        task = Task(tid, "agent", "", 0, "g")
        return Trajectory(tid, task, 0, turns=tuple(session.turns), status=Status.COMPLETED, reward=1.0)


@pytest.fixture
def harness(chat):
    h = Harness(chat)
    yield h
    h.gateway.stop()


def test_chat_turns_extend_the_context_token_for_token(harness, chat):
    client = harness.open("g1/0")
    harness.replies = ["Let me think.", "The answer is \\boxed{12}."]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3*4?"}]
    first = client.chat.completions.create(model="any", messages=messages)
    assert first.choices[0].message.content == "Let me think."
    assert first.choices[0].finish_reason == "stop"
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    second = client.chat.completions.create(model="any", messages=messages)
    assert second.choices[0].message.content == "The answer is \\boxed{12}."
    traj = harness.finish("g1/0")
    requests = harness.llm.requests
    # the engine's second prompt is its first prompt + the sampled ids + only what is new
    assert requests[1].prompt_token_ids[: len(requests[0].prompt_token_ids)] == requests[0].prompt_token_ids
    assert [t.segment for t in traj.turns] == [0, 0]
    assert traj.token_ids() == list(requests[1].prompt_token_ids) + list(traj.turns[1].response_token_ids)
    for turn, request in zip(traj.turns, requests):  # recorded = what the engine produced
        assert turn.response_token_ids == tuple(chat.encode(harness.replies[traj.turns.index(turn)])) + (chat.end_token_id,)
    # the ids are the canonical ones: a fresh tokenisation of the whole conversation gives the same
    full = messages + [{"role": "assistant", "content": second.choices[0].message.content}]
    fresh = chat.encode(chat.render(full, generation_prompt=False))
    assert fresh[: len(traj.token_ids())] == traj.token_ids()
    assert second.usage.prompt_tokens == len(requests[1].prompt_token_ids)
    assert second.usage.completion_tokens == len(traj.turns[1].response_token_ids)


def test_rewritten_history_starts_a_segment_and_the_trainer_gets_each_segment(harness, chat):
    client = harness.open("g2/0")
    harness.replies = ["one", "two", "three"]
    messages = [{"role": "user", "content": "count"}]
    a = client.chat.completions.create(model="m", messages=messages)
    messages += [{"role": "assistant", "content": a.choices[0].message.content}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="m", messages=messages)
    # the agent drops its history (a summarising agent would) and asks again
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "summary: one, two. more"}])
    traj = harness.finish("g2/0")
    assert [t.segment for t in traj.turns] == [0, 0, 1]
    third = harness.llm.requests[2]
    assert traj.turns[2].prompt_token_ids == third.prompt_token_ids  # the whole rendered request
    assert third.prompt_token_ids == tuple(chat.encode(chat.render(
        [{"role": "user", "content": "summary: one, two. more"}], generation_prompt=True)))
    parts = traj.segments()
    assert len(parts) == 2
    batch = build_train_batch([traj], 1, TrainConfig())
    assert len(batch.samples) == 2
    for sample, part, last in zip(batch.samples, parts, (harness.llm.requests[1], third)):
        assert sample.token_ids == tuple(last.prompt_token_ids) + part.turns[-1].response_token_ids
        assert sum(sample.loss_mask) == part.num_response_tokens
    with pytest.raises(ValueError, match="segments"):
        traj.token_ids()


def test_tools_round_trip_with_hermes_calls(harness, chat):
    client = harness.open("g3/0")
    harness.replies = [TOOL_CALL, "\\boxed{148}"]
    messages = [{"role": "user", "content": "What is 37*4?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[CALC])
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    (call,) = message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "37*4"}
    messages += [message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "148"}]
    second = client.chat.completions.create(model="m", messages=messages, tools=[CALC])
    assert second.choices[0].message.content == "\\boxed{148}"
    traj = harness.finish("g3/0")
    assert [t.segment for t in traj.turns] == [0, 0] and all(t.format_ok for t in traj.turns)
    # the tool result went into the template's <tool_response> block, after the model's own ids
    assert "<tool_response>\n148\n</tool_response>" in chat.tokenizer.decode(list(traj.turns[1].prompt_token_ids))
    assert traj.turns[0].action == TOOL_CALL


def test_a_malformed_tool_call_comes_back_as_content(harness):
    client = harness.open("g4/0")
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": 37*4}\n</tool_call>'
    harness.replies = [bad, '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>']
    first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=[CALC])
    assert first.choices[0].message.content == bad and not first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "stop"
    second = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}], tools=[CALC])
    assert second.choices[0].message.tool_calls is None  # an unknown tool is refused too
    session, _ = asyncio.run(harness.gateway.finish("g4/0"))
    assert session.counters["malformed_tool_calls"] == 2
    assert not any(t.format_ok for t in session.turns)


def test_streaming_chat_and_completions(harness, chat):
    client = harness.open("g5/0")
    harness.replies = ["Hello there.", TOOL_CALL, " world", "!"]
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(chat.encode("Hello there.")) + 1
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "calc"}], tools=[CALC],
                                            stream=True)
    calls = [tc for c in stream if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "calculator"
    text = client.completions.create(model="m", prompt="Hello", max_tokens=5)
    assert text.choices[0].text == " world" and text.choices[0].finish_reason == "stop"
    stream = client.completions.create(model="m", prompt="Hello", stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "!"


def test_completions_extend_by_text_or_by_token_ids(harness, chat):
    client = harness.open("g6/0")
    harness.replies = [" 1 2", " 3", " 4"]
    first = client.completions.create(model="m", prompt="Count: 0", logprobs=0)
    assert first.choices[0].logprobs.token_logprobs == [-0.5] * len(first.choices[0].logprobs.tokens)
    context = chat.tokenizer.decode(list(harness.llm.requests[0].prompt_token_ids)
                                    + list(chat.encode(" 1 2")) + [chat.end_token_id])
    client.completions.create(model="m", prompt=context + " and")  # the text so far, stop token included
    ids = list(harness.llm.requests[1].prompt_token_ids) + list(chat.encode(" 3")) + [chat.end_token_id]
    client.completions.create(model="m", prompt=ids + chat.encode(" then"))
    traj = harness.finish("g6/0")
    assert [t.segment for t in traj.turns] == [0, 0, 0]
    assert traj.turns[1].prompt_token_ids == tuple(chat.encode(" and"))
    assert traj.turns[2].prompt_token_ids == tuple(chat.encode(" then"))
    assert traj.token_ids() == list(harness.llm.requests[2].prompt_token_ids) + list(traj.turns[2].response_token_ids)


def test_sampling_parameters_map_onto_the_engines(harness):
    harness.replies = ["a", "b", "c"]
    client = harness.open("g7/0")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], temperature=0.0, seed=5,
                                   max_tokens=500, stop=["\n\n"], top_p=0.5)
    run = harness.llm.requests[-1].sampling
    assert (run.temperature, run.top_p, run.seed) == (1.0, 1.0, 100)  # the run's sampling wins by default
    assert run.max_new_tokens == 40 and run.stop_strings == ("\n\n",)  # capped by the domain
    assert run.stop_token_ids == harness.sampling.stop_token_ids
    client = harness.open("g8/0", source="request")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], temperature=0.0, seed=5,
                                   max_completion_tokens=7, top_p=0.5, extra_body={"top_k": 3})
    req = harness.llm.requests[-1].sampling
    assert (req.temperature, req.top_p, req.top_k, req.seed, req.max_new_tokens) == (0.0, 0.5, 3, 5, 7)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"n": 9}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"tool_choice": {"type": "function", "function": {"name": "rm"}}, "tools": [CALC]}, "tool_choice"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"extra_body": {"guided_json": {}}}, "guided_json"),
        ({"temperature": 7}, "temperature"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages.0.content"),
    ],
)
def test_unsupported_parameters_are_refused_by_name(harness, kwargs, param):
    client = harness.open(f"g9/{param}")
    harness.replies = ["x"]
    args = {"model": "m", "messages": [{"role": "user", "content": "x"}], **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    error = err.value.body
    assert param.split(".")[0] in error["message"] and error["param"].replace("[", ".").startswith(param.split(".")[0])
    assert harness.llm.requests == []  # nothing reached the engine


def test_errors_for_unknown_finished_cancelled_trajectories_and_bad_keys(harness):
    harness.replies = ["x", "y"]
    client = harness.open("g10/0")
    base = harness.gateway.base_url("nope/0")
    # an unknown id answers as a wrong key does: nothing tells a caller without the key which ids exist
    with pytest.raises(openai.AuthenticationError, match="wrong or missing API key"):
        openai.OpenAI(base_url=base, api_key="k", max_retries=0, http_client=http_client()).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}])
    wrong = openai.OpenAI(base_url=harness.gateway.base_url("g10/0"), api_key="not-the-key", max_retries=0,
                          http_client=http_client())
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    harness.finish("g10/0")
    with pytest.raises(openai.AuthenticationError):  # ended, asked without its key: still 401 first
        wrong.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 410 and err.value.body["code"] == "trajectory_finished"
    other = harness.open("g11/0")
    asyncio.run(harness.gateway.cancel("g11/0"))
    with pytest.raises(openai.APIStatusError) as err:
        other.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 410 and err.value.body["code"] == "trajectory_cancelled"


def test_limits_bound_what_a_request_may_cost(chat):
    h = Harness(chat, GatewayConfig(max_body_mb=0.01, max_messages=3))
    try:
        h.replies = ["x"] * 5
        client = h.open("g12/0", max_calls=2, max_total_tokens=64)
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 20000}])
        assert err.value.status_code == 413
        with pytest.raises(openai.BadRequestError, match="more than this gateway accepts"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}] * 4)
        with pytest.raises(openai.BadRequestError, match="max_total_tokens"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "lorem ipsum " * 40}])
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "c"}])
        assert err.value.body["code"] == "max_turns_exceeded"
        session, _ = asyncio.run(h.gateway.finish("g12/0"))
        assert session.truncated.startswith("max_turns")
        import httpx

        r = httpx.post(h.gateway.url + "/t/g13%2F0/v1/chat/completions", content=b"{not json")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"  # before the body is read
        assert httpx.get(h.gateway.url + "/elsewhere").json()["error"]["code"] == "not_found"
    finally:
        h.gateway.stop()


def test_cancel_aborts_the_call_in_flight_and_keeps_its_partial_turn(chat):
    h = Harness(chat, delay_s=30.0)
    try:
        h.replies = ["a long answer that takes a while"]
        client = h.open("g14/0")
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        for _ in range(2000):  # until the call is generating (≤ 20 s)
            if h.llm.requests:
                break
            time.sleep(0.01)
        start = time.monotonic()
        asyncio.run(h.gateway.cancel("g14/0"))
        thread.join(10)
        assert time.monotonic() - start < 15  # the call was aborted, not left to its 30 s
        assert isinstance(outcome[0], openai.APIStatusError) and outcome[0].status_code == 410
        session, _ = asyncio.run(h.gateway.finish("g14/0"))
        (turn,) = session.turns
        assert turn.finish_reason == "abort" and len(turn.response_token_ids) == 1
        assert h.llm.aborted == ["g14/0"]
    finally:
        h.gateway.stop()


def test_the_async_client_and_concurrent_trajectories(harness):
    harness.llm.reply = lambda request, k: f"answer {request.trajectory_id}"

    async def agent(i: int, http) -> str:
        base, key = harness.gateway.open(f"c/{i}", domain="agent", limits=SessionLimits(4, 1024),
                                         sampling=harness.sampling)
        client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, http_client=http)
        r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(i)}])
        return r.choices[0].message.content

    async def main() -> list[str]:
        async with openai.DefaultAsyncHttpxClient() as http:
            return await asyncio.gather(*(agent(i, http) for i in range(20)))

    assert asyncio.run(main()) == [f"answer c/{i}" for i in range(20)]
    assert harness.gateway.open_sessions == 20
