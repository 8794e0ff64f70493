"""Pure parts of the agent gateway: the Hermes tool-call parser and OpenAI message / tool normalisation."""

from __future__ import annotations

import pytest

from rollart.envs.agents.errors import GatewayError
from rollart.envs.agents.messages import message_key, template_messages, template_tools
from rollart.envs.tool_calls import detect_family
from rollart.envs.tool_calls.hermes import parse as parse_hermes
from rollart.models.tiny import CHATML_TEMPLATE

TOOLS = {"calculator", "search"}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'


def test_hermes_calls_parse_into_openai_tool_calls():
    out = parse_hermes(f"Let me compute.\n{CALL}\n{CALL.replace('calculator', 'search')}", TOOLS, "call_1")
    assert out.content == "Let me compute." and not out.malformed
    assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == [
        ("call_1_0", "calculator", {"expression": "2*3"}), ("call_1_1", "search", {"expression": "2*3"})]
    assert out.tool_calls[0].to_openai()["function"]["arguments"] == '{"expression": "2*3"}'
    assert parse_hermes("just text", TOOLS, "c") == parse_hermes("just text", TOOLS, "c")
    assert parse_hermes("just text", TOOLS, "c").tool_calls == ()


@pytest.mark.parametrize("text, reason", [
    (CALL + " and more", "text after the last of the tool calls"),
    (CALL + "\nhmm\n" + CALL, "text between tool calls"),
    ("<tool_call>\n{\"name\": \"calculator\"", "never closed"),
    ('<tool_call>{"name": calculator}</tool_call>', "not valid JSON"),
    ('<tool_call>["calculator"]</tool_call>', "with a 'name'"),
    ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "names 'rm'"),
    ('<tool_call>{"name": "search", "arguments": "q"}</tool_call>', "not a JSON object"),
    ('<tool_call>{"name": "search", "arguments": {}, "x": 1}</tool_call>', "keys besides"),
    ("oops </tool_call>", "without a '<tool_call>'"),
])
def test_malformed_calls_are_plain_content_with_a_reason(text, reason):
    out = parse_hermes(text, TOOLS, "c")
    assert out.content == text and out.tool_calls == () and reason in out.malformed


def test_the_family_comes_from_the_template():
    assert detect_family(CHATML_TEMPLATE) == "hermes"
    assert detect_family("{% for m in messages %}{{ m['content'] }}{% endfor %}") is None


def test_messages_are_checked_and_converted_for_the_template():
    messages = template_messages([
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "2*3?", "name": "ann"},
        {"role": "assistant", "content": None, "refusal": None, "annotations": [], "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2*3"}'}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "6"},
    ], max_messages=8)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"expression": "2*3"}
    assert messages[3] == {"role": "tool", "content": "6", "tool_call_id": "c0", "name": "calculator"}
    echoed = dict(messages[2], tool_calls=[dict(messages[2]["tool_calls"][0], id="other")])
    assert message_key(echoed) == message_key(messages[2])  # call ids do not decide tokens


@pytest.mark.parametrize("raw, param", [
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "x", "audio": {"id": "a"}}], "messages[0].audio"),
    ([{"role": "user", "content": "x", "weird": 1}], "messages[0].weird"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "tool", "content": "6"}], "messages[0].tool_call_id"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([], "messages"),
])
def test_bad_messages_are_400s_naming_the_field(raw, param):
    with pytest.raises(GatewayError) as err:
        template_messages(raw, max_messages=8)
    assert err.value.status == 400 and err.value.param == param


def test_tools_are_function_schemas_only():
    assert template_tools(None, 4) == []
    with pytest.raises(GatewayError, match="only function tools"):
        template_tools([{"type": "code_interpreter"}], 4)
    with pytest.raises(GatewayError, match="more than this gateway accepts"):
        template_tools([{"type": "function", "function": {"name": "f"}}] * 5, 4)
