"""The gateway's other protocols — OpenAI Responses and Anthropic Messages — through the real `openai` and
`anthropic` clients, onto the same exact-token session as chat completions (a scripted LLM client: the point
is the protocol, HTTP to turns, not generation)."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from rollart.envs.chat import ChatTokens
from rollart.models.tiny import build_tokenizer
from tests.unit.test_agent_gateway import CALC, TOOL_CALL, Harness, http_client

RESPONSES_CALC = {"type": "function", "name": "calculator", "description": "Evaluate an arithmetic expression",
                  "parameters": CALC["function"]["parameters"]}
ANTHROPIC_CALC = {"name": "calculator", "description": "Evaluate an arithmetic expression",
                  "input_schema": CALC["function"]["parameters"]}


@pytest.fixture(scope="module")
def chat() -> ChatTokens:
    return ChatTokens(build_tokenizer(tool_calls=True))


@pytest.fixture
def harness(chat):
    h = Harness(chat)
    yield h
    h.gateway.stop()


def anthropic_client(harness: Harness, tid: str) -> anthropic.Anthropic:
    base, key = harness.gateway.open(tid, domain="agent", limits=harness_limits(), sampling=harness.sampling,
                                     seed_for=lambda k: 100 + k)
    # as Anthropic's docs write it: the base URL as given (the SDK adds /v1/messages; the gateway serves that too)
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)


def harness_limits():
    from rollart.envs.agents.session import SessionLimits

    return SessionLimits(8, 1024)


def test_responses_tool_loop_extends_one_session(harness, chat):
    client = harness.open("r1/0")
    harness.replies = [TOOL_CALL, "\\boxed{148}"]
    first = client.responses.create(model="m", instructions="Use the tool.", input="What is 37*4?",
                                    tools=[RESPONSES_CALC])
    assert first.status == "completed" and first.object == "response"
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "37*4"}
    # the agent sends back the output items and the tool's result, as the Agents SDK does
    items = [{"role": "user", "content": "What is 37*4?"}, *[i.model_dump(exclude_none=True) for i in first.output],
             {"type": "function_call_output", "call_id": call.call_id, "output": "148"}]
    second = client.responses.create(model="m", instructions="Use the tool.", input=items, tools=[RESPONSES_CALC])
    assert second.output_text == "\\boxed{148}"
    assert second.usage.input_tokens == len(harness.llm.requests[1].prompt_token_ids)
    traj = harness.finish("r1/0")
    assert [t.segment for t in traj.turns] == [0, 0]  # one segment: the second call extended the first
    assert "<tool_response>\n148\n</tool_response>" in chat.tokenizer.decode(list(traj.turns[1].prompt_token_ids))
    assert traj.token_ids() == list(harness.llm.requests[1].prompt_token_ids) + list(traj.turns[1].response_token_ids)


def test_responses_previous_response_id_and_store(harness):
    client = harness.open("r2/0")
    harness.replies = ["one", "two", "three"]
    first = client.responses.create(model="m", input="count")
    second = client.responses.create(model="m", input="more", previous_response_id=first.id)
    assert second.output_text == "two" and second.previous_response_id == first.id
    unstored = client.responses.create(model="m", input="more", previous_response_id=second.id, store=False)
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        client.responses.create(model="m", input="x", previous_response_id=unstored.id)
    traj = harness.finish("r2/0")
    assert [t.segment for t in traj.turns] == [0, 0, 0]


def test_responses_streaming_events(harness):
    client = harness.open("r3/0")
    harness.replies = ["Hello there.", TOOL_CALL]
    events = list(client.responses.create(model="m", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello there."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with client.responses.stream(model="m", input="calc", tools=[RESPONSES_CALC]) as stream:
        final = stream.get_final_response()
    assert [i.type for i in final.output] == ["function_call"] and final.output[0].name == "calculator"


def test_responses_refuse_by_name(harness):
    client = harness.open("r4/0")
    harness.replies = ["x"]
    for kwargs, param in [({"tools": [{"type": "web_search"}]}, "tools[0].type"),
                          ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
                           "input[0].content[0].type"),
                          ({"truncation": "auto"}, "truncation"), ({"top_logprobs": 3}, "top_logprobs")]:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(**{"model": "m", "input": "x", **kwargs})
        assert err.value.body["param"] == param
    assert harness.llm.requests == []


def test_anthropic_messages_tool_loop(harness, chat):
    client = anthropic_client(harness, "a1/0")
    harness.replies = [TOOL_CALL, "\\boxed{148}"]
    messages = [{"role": "user", "content": "What is 37*4?"}]
    first = client.messages.create(model="m", max_tokens=64, system="Use the tool.", messages=messages,
                                   tools=[ANTHROPIC_CALC])
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "calculator" and use.input == {"expression": "37*4"}
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "148"}]}]
    second = client.messages.create(model="m", max_tokens=64, system="Use the tool.", messages=messages,
                                    tools=[ANTHROPIC_CALC])
    assert second.content[0].text == "\\boxed{148}" and second.stop_reason == "end_turn"
    assert second.usage.input_tokens == len(harness.llm.requests[1].prompt_token_ids)
    traj = harness.finish("a1/0")
    assert [t.segment for t in traj.turns] == [0, 0]
    assert "<tool_response>\n148\n</tool_response>" in chat.tokenizer.decode(list(traj.turns[1].prompt_token_ids))


def test_anthropic_stop_sequences_streaming_and_count_tokens(harness, chat):
    client = anthropic_client(harness, "a2/0")
    harness.replies = ["Thought: add.\nObservation: 4", "ok"]
    reply = client.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "2+2"}],
                                   stop_sequences=["Observation:"])
    # the scripted engine does not stop on strings: the gateway cuts the content before the stop string
    assert reply.content[0].text == "Thought: add.\n"
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "Observation:"
    with client.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "x"}]) as stream:
        assert "".join(stream.text_stream) == "ok"
        assert stream.get_final_message().stop_reason == "end_turn"
    counted = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}])
    assert counted.input_tokens == len(chat.encode(chat.render([{"role": "user", "content": "hello"}], True)))


def test_anthropic_errors_have_anthropics_shape(harness):
    client = anthropic_client(harness, "a3/0")
    harness.replies = ["x"]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "messages.0.content.0.type" in err.value.body["error"]["message"]
    wrong = anthropic.Anthropic(base_url=harness.gateway.base_url("a3/0"), api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        wrong.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert err.value.body["error"]["type"] == "authentication_error"
    # Anthropic's own header for the key works as well as a bearer token
    url = harness.gateway.base_url("a3/0") + "/messages"
    key = harness.gateway._entries["a3/0"].session.key
    answer = httpx.post(url, headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                        json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]})
    assert answer.status_code == 200 and answer.json()["type"] == "message"


def test_unknown_routes_name_the_routes_that_exist(harness):
    harness.open("u/0")
    answer = httpx.post(harness.gateway.base_url("u/0") + "/embeddings", json={})
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    for route in ("chat/completions", "responses", "messages", "completions", "models"):
        assert f"/v1/{route}" in message


def test_chat_stop_cuts_the_content_and_logprobs_leave_out_the_end_of_turn_token(harness, chat):
    client = harness.open("s/0")
    harness.replies = ["I should look.\nObservation: it is 4", "done"]
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                           stop=["Observation:"], logprobs=True)
    # as OpenAI: the content ends before the stop string; the recorded ids keep the token that completed it
    assert reply.choices[0].message.content == "I should look.\n" and reply.choices[0].finish_reason == "stop"
    second = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}], logprobs=True)
    traj = harness.finish("s/0")
    assert "Observation:" in chat.tokenizer.decode(list(traj.turns[0].response_token_ids))
    assert len(reply.choices[0].logprobs.content) == len(traj.turns[0].response_token_ids)  # no end token there
    assert traj.turns[1].response_token_ids[-1] == chat.end_token_id
    assert len(second.choices[0].logprobs.content) == len(traj.turns[1].response_token_ids) - 1


def test_n_choices_the_continued_one_is_the_trajectory(harness, chat):
    client = harness.open("n/0")
    harness.llm.reply = lambda request, k: "choice " + (request.request_id.split(".")[1] if "." in request.request_id else "0")
    messages = [{"role": "user", "content": "pick"}]
    reply = client.chat.completions.create(model="m", messages=messages, n=3)
    assert [c.message.content for c in reply.choices] == ["choice 0", "choice 1", "choice 2"]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == sum(len(chat.encode(f"choice {c}")) + 1 for c in range(3))
    seeds = {r.sampling.seed for r in harness.llm.requests}
    assert len(seeds) == 3  # the choices are sampled apart
    # the agent continues with choice 2: that one is the turn, the others are counted and dropped
    messages += [reply.choices[2].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="m", messages=messages)
    last = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "fresh"}], n=2)
    assert len(last.choices) == 2
    session, _ = __import__("asyncio").run(harness.gateway.finish("n/0"))
    turns = session.turns
    assert len(turns) == 3 and session.counters["choices_dropped"] == 2 + 1  # the last call: its first choice
    assert chat.tokenizer.decode(list(turns[0].response_token_ids), skip_special_tokens=True) == "choice 2"
    assert [t.segment for t in turns] == [0, 0, 1]
    second = harness.llm.requests[3]
    assert second.prompt_token_ids[: len(harness.llm.requests[2].prompt_token_ids)] == harness.llm.requests[2].prompt_token_ids
    assert tuple(second.prompt_token_ids[len(harness.llm.requests[2].prompt_token_ids):][: len(turns[0].response_token_ids)]) \
        == turns[0].response_token_ids


def test_reasoning_effort_and_verbosity_are_accepted(harness, caplog):
    client = harness.open("re/0")
    harness.replies = ["a", "b"]
    with caplog.at_level("INFO", logger="rollart.envs.agents.calls"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       reasoning_effort="none", verbosity="low", store=True)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}], reasoning_effort="high")
    said = [r for r in caplog.records if "no thinking switch" in r.getMessage()]
    assert len(said) == 1  # this template has no thinking switch: accepted, said once
    harness.finish("re/0")


def test_reasoning_effort_drives_a_templates_thinking_switch():
    tokenizer = build_tokenizer(tool_calls=True)
    # Qwen3's switch: enable_thinking=false writes an empty think block into the generation prompt
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not "
        "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
    chat = ChatTokens(tokenizer)
    assert chat.has_thinking_switch
    h = Harness(chat)
    try:
        client = h.open("think/0")
        h.replies = ["a", "b", "c", "d"]
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], reasoning_effort="none")
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], reasoning_effort="high")
        client.responses.create(model="m", input="x", reasoning={"effort": "minimal"})  # the Agents SDK's way
        anthropic.Anthropic(base_url=str(client.base_url), api_key=client.api_key, max_retries=0).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}], thinking={"type": "disabled"})
        off, on, responses_off, messages_off = (chat.tokenizer.decode(list(r.prompt_token_ids)) for r in h.llm.requests)
        assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")
        assert responses_off.endswith("<think>\n\n</think>\n\n") and messages_off.endswith("<think>\n\n</think>\n\n")
        h.finish("think/0")
    finally:
        h.gateway.stop()
