"""A math agent with a calculator tool, written only against the `openai` package — train it with rollart by
naming it in a run config (see calculator.yaml beside this file):

    domains:
      calc: {agent: calculator_agent:run, demonstrations: calculator_agent:demonstration}

rollart calls `run(base_url, api_key, task)` once per trajectory with a base URL and key of its own; every
model call through that client is a turn rollart records token for token and trains on. The same function
runs against any OpenAI-compatible server (vLLM, a hosted model):

    asyncio.run(run("http://localhost:8000/v1", "key", SimpleNamespace(seed=1, options={}, model="my-model")))

`task.seed` picks the problem (rollart keeps training and validation seeds apart), `task.options` is the
domain's `options` (here: `max_operand`, `max_calls`), `task.model` a model name to send. The return value
is the reward. `demonstration(task, expert)` is the conversation an expert would have on the same problem
(`expert=False`: a guess without the tool), for rollart's supervised warm start.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re

from openai import AsyncOpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def problem(seed: int, options: dict) -> tuple[str, int, str]:
    """(question, answer, expression) of one episode."""
    rng = random.Random(seed)
    top = int(options.get("max_operand", 9))
    a, b = rng.randint(2, top), rng.randint(2, top)
    return f"Calculate \"{a}*{b}\".", a * b, f"{a}*{b}"


def calculate(expression: str) -> str:
    """+, - and * of integers, nothing else (the model's arguments are untrusted)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 10**6:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("unsupported expression")

    try:
        return str(value(ast.parse(expression[:100], mode="eval").body))
    except (SyntaxError, ValueError, RecursionError):
        return "error: only integers with + - * are supported"


def final_answer(text: str | None) -> str | None:
    found = re.findall(r"\\boxed\{([^}]*)\}", text or "")
    return found[-1].strip() if found else None


async def run(base_url: str, api_key: str, task) -> float:
    question, answer, _ = problem(task.seed, task.options)
    messages = [{"role": "user", "content": question}]
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        for _ in range(int(task.options.get("max_calls", 3))):
            response = await client.chat.completions.create(
                model=task.model, messages=messages, tools=[CALCULATOR], max_tokens=32
            )
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                expression = json.loads(call.function.arguments).get("expression", "")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})
    return 1.0 if final_answer(message.content) == str(answer) else 0.0


def demonstration(task, expert: bool) -> dict:
    question, answer, expression = problem(task.seed, task.options)
    if not expert:  # a guess: well formed, almost always wrong
        guess = random.Random(task.seed + 1).randint(4, int(task.options.get("max_operand", 9)) ** 2)
        return {"messages": [{"role": "user", "content": question},
                             {"role": "assistant", "content": f"\\boxed{{{guess}}}"}], "tools": [CALCULATOR]}
    call = {"id": "call_0", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": calculate(expression)},
            {"role": "assistant", "content": f"\\boxed{{{answer}}}"},
        ],
        "tools": [CALCULATOR],
    }
