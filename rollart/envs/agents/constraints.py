"""Forced tool calls and structured output as a grammar the engine samples under (constrained decoding).

In: a `ChatCall`'s tool choice and tools, its output schema (`response_format` json_object / json_schema, the
Responses API's `text.format`), the model family's tool-call format (`rollart/envs/tool_calls`) and the
tokenizer. Out: `SamplingParams.grammar` — a grammar in llguidance's Lark dialect that only the outputs the
request demands satisfy: `tool_choice: required` → one call (several with `parallel_tool_calls`) of any
offered tool in the family's format, its arguments valid under the tool's `parameters` schema; a named tool →
one call of that tool; a JSON schema → JSON valid under it (with tools under `auto`, either). None when the
request demands nothing. The engine masks its logits with it (rollart/inference/constrained.py), so the tokens
recorded and trained on are the ones sampled under it.

JSON is written compactly (`", "` and `": "` separators, no other whitespace: what `json.dumps` writes and
what the families' templates render), so a constrained output re-renders to the same text. A marker of the
call format that the tokenizer holds as one added token (Qwen's `<tool_call>`) is written as that token, as
the model writes it unconstrained. A schema the grammar library cannot compile is a 400 naming the parameter.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from rollart.envs.agents.call import ChatCall
from rollart.envs.agents.errors import bad_request, unsupported
from rollart.envs.tool_calls import FAMILIES
from rollart.envs.tool_calls.grammar import json_rule, quoted

Literal = Callable[[str], str]  # text → a Lark literal (a quoted string, or `<[id]>` for one added token)


def literal_for(tokenizer: Any) -> Literal:
    """Markers that are one added token of the tokenizer become that token; other text a quoted string."""
    added = {str(t): i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}

    def lit(text: str) -> str:
        token = added.get(text)
        return f"<[{token}]>" if token is not None else quoted(text)

    return lit


def _parameters(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    params = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    return params if isinstance(params, Mapping) else {"type": "object"}


def grammar_for(call: ChatCall, family: str | None, lit: Literal) -> str | None:
    """The grammar the call must be sampled under (module docstring), or None."""
    choice, tools = call.tool_choice, call.tools
    forced = choice.mode in ("required", "named")
    if forced and not tools:
        raise bad_request(f"tool_choice={choice.mode!r} needs tools", "tool_choice")
    rules: list[str] = []
    alternatives: list[str] = []
    if tools and (forced or (call.output_schema is not None and choice.mode == "auto")):
        if family not in FAMILIES:
            raise unsupported("tool_choice", choice.mode, "forced tool calls are written in the model family's "
                              "format, and this model's chat template renders no tool calls (envs.gateway.tool_parser)")
        fam = FAMILIES[family]
        offered: Sequence[Mapping[str, Any]] = [t for t in tools if choice.mode != "named"
                                                or t["function"]["name"] == choice.name]
        for i, tool in enumerate(offered):
            rules.append(f"call_{i}: {fam.call_grammar(tool['function']['name'], _parameters(tool), lit)}")
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(offered))))
        several = call.parallel_tool_calls and choice.mode != "named"
        between = f"({quoted(fam.between)} call)*" if fam.between else "call*"
        alternatives.append(fam.wrap(f"call {between}" if several else "call", lit))
    if call.output_schema is not None and not forced:
        alternatives.append(json_rule(call.output_schema))
    if not alternatives:
        return None
    return "\n".join([f"start: {' | '.join(alternatives)}", *rules])


def check_grammar(grammar: str, param: str) -> None:
    """A 400 naming `param` when the grammar library cannot compile the grammar (e.g. a schema keyword it
    does not support), before anything reaches the engine."""
    import llguidance

    error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if error:
        raise bad_request(f"{param}: cannot be enforced ({'; '.join(messages)[:300]})", param)


def output_schema(response_format: Any, param: str) -> dict[str, Any] | None:
    """OpenAI's `response_format` (chat) or `text.format` (Responses) as a JSON schema; None for text."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema", response_format)  # chat nests it; Responses does not
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise bad_request(f"{param}: a json_schema format needs a 'schema' object", param)
        return dict(schema)
    raise unsupported(param, response_format, "{'type': 'text'}, {'type': 'json_object'} or a json_schema")
