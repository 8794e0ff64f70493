"""Agents for the agent-domain integration tests (imported by the env workers as
`tests.integration.agents_for_tests:<name>`, the repository root being their working directory)."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI


async def rewriting(base_url: str, api_key: str, task) -> float:
    """Three calls: the second extends the first, the third drops the history (a new segment)."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = [{"role": "user", "content": "What is 1 + 2?"}]
        first = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=6)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
        await client.chat.completions.create(model=task.model, messages=messages, max_tokens=6)
        await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "Summary: 3"}],
                                             max_tokens=6)
    return 0.5


async def one_call_then_wait(base_url: str, api_key: str, task) -> float:
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4)
        await asyncio.sleep(120)
    return 1.0
