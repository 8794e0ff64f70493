"""The calculator agent written with the `anthropic` SDK (Messages API, tool use), trained by rollart unchanged:

    domains:
      calc: {agent: anthropic_agent:run}

`Anthropic(base_url=base_url)` works with the base URL as rollart gives it (the gateway serves the path the
SDK adds, /v1/messages, under it).
"""

from __future__ import annotations

from anthropic import AsyncAnthropic

from calculator_agent import calculate, final_answer, problem

CALCULATOR = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}


async def run(base_url: str, api_key: str, task) -> float:
    question, answer, _ = problem(task.seed, task.options)
    client = AsyncAnthropic(base_url=base_url, api_key=api_key)
    messages = [{"role": "user", "content": question}]
    for _ in range(int(task.options.get("max_calls", 3))):
        reply = await client.messages.create(model=task.model, max_tokens=64, messages=messages, tools=[CALCULATOR])
        messages.append({"role": "assistant", "content": reply.content})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if reply.stop_reason != "tool_use" or not uses:
            break
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": calculate(str(use.input.get("expression", "")))}
            for use in uses]})
    text = "".join(block.text for block in reply.content if block.type == "text")
    return 1.0 if final_answer(text) == str(answer) else 0.0
