"""Every tool-call family: its parser reads back what its template renders (a round trip over random calls),
its template is recognised by its markers, and no text a model may write makes a parser raise."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.envs.tool_calls import FAMILIES, detect_family, parser_for
from rollart.models.tiny import build_tokenizer
from tests.unit.tool_templates import call_ids, template

SCHEMAS = {
    "calc": {"type": "object", "properties": {"x": {"type": "string"}, "n": {"type": "integer"},
                                              "ok": {"type": "boolean"}, "tags": {"type": "array"}}},
    "search": {"type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "number"}}},
}
TEMPLATE_SNIPPETS = {  # what each family's real chat template holds (its markers), abridged
    "hermes": "<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>",
    "qwen3_coder": "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>",
    "llama3_json": '<|start_header_id|>ipython<|end_header_id|> {"name": function name, "parameters": '
                   "dictionary of argument name and its value}",
    "mistral": "[AVAILABLE_TOOLS] ... [TOOL_CALLS] [",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'",
    "glm45": "<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>\\n<arg_value>{arg-value-1}</arg_value>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>{{ tool_call['id'] }}<|tool_call_argument_begin|>",
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(tool_calls=True)


def test_every_family_is_detected_from_its_template():
    assert set(TEMPLATE_SNIPPETS) == set(FAMILIES) == {"hermes", "qwen3_coder", "llama3_json", "mistral",
                                                        "deepseek_v3", "glm45", "kimi_k2"}
    for family, snippet in TEMPLATE_SNIPPETS.items():
        assert detect_family(snippet) == family
    assert detect_family("{{ messages }}") is None and detect_family(None) is None


def test_the_config_names_every_family():
    from typing import get_args

    from rollart.config.envs import GatewayConfig

    assert set(get_args(GatewayConfig.model_fields["tool_parser"].annotation)) == {"auto", "none", *FAMILIES}


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>\n\r"), min_size=1,
               max_size=12).filter(lambda s: s.strip() == s)
values = {"x": text, "n": st.integers(-10**6, 10**6), "ok": st.booleans(),
          "tags": st.lists(st.integers(0, 9) | text, max_size=3), "query": text,
          "k": st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 3))}


@st.composite
def calls(draw):
    out = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(SCHEMAS)))
        keys = draw(st.lists(st.sampled_from(sorted(SCHEMAS[name]["properties"])), unique=True, min_size=1))
        out.append((name, {k: draw(values[k]) for k in keys}))
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=calls(), content=st.sampled_from(["", "Let me check."]))
def test_the_parser_reads_what_the_template_renders(tokenizer, family, drawn, content):
    if family == "llama3_json":
        content = ""  # Llama's calls are the whole message
    tokenizer.chat_template = template(family)
    ids = call_ids(family, [n for n, _ in drawn])
    message = {"role": "assistant", "content": content, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in zip(ids, drawn)]}
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, message], tokenize=False)
    written = rendered[rendered.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):
                       rendered.rindex("<|im_end|>")]
    parsed = parser_for(family)(written, SCHEMAS, "call_0")
    assert not parsed.malformed, (written, parsed.malformed)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == drawn
    assert [c.id for c in parsed.tool_calls] == ids  # the ids the template writes back (Mistral's, Kimi's)
    assert parsed.content == content


def test_a_call_to_an_unknown_tool_or_with_bad_arguments_is_malformed():
    cases = {
        "hermes": '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>',
        "qwen3_coder": "<tool_call>\n<function=calc>\n<parameter=n>\nabc\n</parameter>\n</function>\n</tool_call>",
        "llama3_json": '{"name": "calc", "parameters": [1]}',
        "mistral": '[TOOL_CALLS] [{"name": "calc", "arguments": {}, "extra": 1}]',
        "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{oops\n```"
                       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "glm45": "<tool_call>calc\n<arg_key>n</arg_key>\n<arg_value>1</arg_value>\nstray</tool_call>",
        "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>calc<|tool_call_argument_begin|>{}"
                   "<|tool_call_end|><|tool_calls_section_end|>",
    }
    assert set(cases) == set(FAMILIES)
    for family, written in cases.items():
        parsed = parser_for(family)(written, SCHEMAS, "c")
        assert parsed.malformed and parsed.tool_calls == () and parsed.content == written, family


MARKERS = ["<tool_call>", "</tool_call>", "<function=calc>", "</function>", "<parameter=x>", "</parameter>",
           "[TOOL_CALLS]", "[ARGS]", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
           "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
           "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
           "<|tool_calls_section_end|>", "<|python_tag|>", '{"name": "calc", "arguments": ', '"parameters": ',
           "function", "calc", "```json\n", "{", "}", "[", "]", '"', ":", ",", ";", "\n", " ", "\\", "\ud800", "é"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(MARKERS) | st.text(max_size=4), max_size=40))
def test_no_model_text_makes_a_parser_raise(family, pieces):
    written = "".join(pieces)
    parsed = parser_for(family)(written, SCHEMAS, "c")
    assert isinstance(parsed.content, str)
    if parsed.tool_calls:
        assert all(c.name in SCHEMAS and isinstance(c.arguments, dict) for c in parsed.tool_calls)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_adversarial_shapes_are_format_errors_not_exceptions(family):
    deep = "[" * 100_000 + "]" * 100_000
    for written in [
        f'<tool_call>\n{{"name": "calc", "arguments": {deep}}}\n</tool_call>',
        f'{{"name": "calc", "parameters": {{"x": {deep}}}}}',
        f"[TOOL_CALLS] {deep}",
        f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{deep}\n```<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>",
        f"<|tool_calls_section_begin|><|tool_call_begin|>functions.calc:0<|tool_call_argument_begin|>{deep}"
        "<|tool_call_end|><|tool_calls_section_end|>",
        "<tool_call>\n<function=calc>\n<parameter=tags>\n" + deep + "\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>" * 50_000, "<|tool_calls_section_begin|>" + "<|tool_call_begin|>" * 20_000,
        "x" * 2_000_000 + "<tool_call>", "\ud800\udfff<tool_call>\x00</tool_call>",
    ]:
        parsed = parser_for(family)(written, SCHEMAS, "c")
        assert isinstance(parsed.content, str)
