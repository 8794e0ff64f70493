"""A tool-choice agent written only against the `openai` package (`lookup_agent:run`, warm start
`lookup_agent:demonstration`), small enough that RL visibly teaches the tiny model to use a tool.

The model is offered three tools — `lookup`, `search`, `calculator` — and asked for the word `lookup`
returns. The agent runs every tool call the model makes (parsed by rollart's gateway into OpenAI
`tool_calls`), sends each result back as a `tool` message and calls the model again. Reward 1 when the
model called `lookup` and then answered `\\boxed{<what lookup returned>}`, else 0.

What makes it learnable in a test budget: each tool name is one token of the tiny tokenizer and each
tool's result is a fixed word, so the behaviour is a choice (which tool) followed by passing that tool's
result on — no copying of varying values, which the tiny model does not learn in a few dozen steps. The
demonstrations call `lookup` when `expert` (else one of the two other tools) and always pass the called
tool's result on: a warm start on a mix teaches the call format and the second call, and leaves the
choice of tool to RL. The returned `metrics` (logged as `env/<domain>/agent/called_<tool>`) say which tools were called.
"""

from __future__ import annotations

import json
import random
import re

from openai import AsyncOpenAI

QUESTION = "What word does the lookup tool return? Answer \\boxed{word}."
RESULTS = {"lookup": "python", "search": "file", "calculator": "code"}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                      "parameters": {"type": "object", "properties": {}}}}
    for name in RESULTS
]


def final_answer(text: str | None) -> str | None:
    found = re.findall(r"\\boxed\{([^}]*)\}", text or "")
    return found[-1].strip() if found else None


async def run(base_url: str, api_key: str, task) -> dict:
    messages = [{"role": "user", "content": QUESTION}]
    called: set[str] = set()
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        for _ in range(2):  # the tool call, then the answer
            response = await client.chat.completions.create(
                model=task.model, messages=messages, tools=TOOLS, max_tokens=24
            )
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:  # the gateway only returns calls of offered tools
                called.add(call.function.name)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": RESULTS[call.function.name]})
    right = "lookup" in called and final_answer(message.content) == RESULTS["lookup"]
    return {"reward": float(right), "metrics": {f"called_{name}": float(name in called) for name in RESULTS}}


def demonstration(task, expert: bool) -> dict:
    tool = "lookup" if expert else random.Random(task.seed).choice(["search", "calculator"])
    call = {"id": "call_0", "type": "function", "function": {"name": tool, "arguments": json.dumps({})}}
    return {
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": RESULTS[tool]},
            {"role": "assistant", "content": f"\\boxed{{{RESULTS[tool]}}}"},
        ],
        "tools": TOOLS,
    }

