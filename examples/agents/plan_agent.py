"""A two-call agent — plan, then answer — written only against the `openai` package.

The first call asks for a short plan, the second, in the same conversation, for the final answer in
\\boxed{}. It returns no reward of its own: it hands the reference answer back and leaves scoring to the
domain's reward (`reward: math` checks the last model output with math-verify):

    domains:
      plan: {agent: plan_agent:run, reward: math, max_turns: 2}

`task.seed` picks the problem, `task.options` may set `max_operand`.
"""

from __future__ import annotations

import random

from openai import AsyncOpenAI


def problem(seed: int, options: dict) -> tuple[str, int]:
    rng = random.Random(seed)
    top = int(options.get("max_operand", 20))
    a, b = rng.randint(1, top), rng.randint(1, top)
    return f"What is {a} + {b}?", a + b


async def run(base_url: str, api_key: str, task) -> dict:
    question, answer = problem(task.seed, task.options)
    messages = [{"role": "user", "content": f"{question}\nFirst write a one-line plan."}]
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        plan = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=24)
        messages += [
            {"role": "assistant", "content": plan.choices[0].message.content or ""},
            {"role": "user", "content": "Now give the final answer as \\boxed{number}."},
        ]
        await client.chat.completions.create(model=task.model, messages=messages, max_tokens=16)
    return {"reference": {"answer": str(answer)}}


def demonstration(task, expert: bool) -> dict:
    question, answer = problem(task.seed, task.options)
    final = answer if expert else random.Random(task.seed + 1).randint(2, 2 * int(task.options.get("max_operand", 20)))
    return {"messages": [
        {"role": "user", "content": f"{question}\nFirst write a one-line plan."},
        {"role": "assistant", "content": "Add the two numbers."},
        {"role": "user", "content": "Now give the final answer as \\boxed{number}."},
        {"role": "assistant", "content": f"\\boxed{{{final}}}"},
    ]}
