"""An agent with a bug: it asks for `n=64` completions, past the gateway's 8 (refused with a 400), so the openai client
raises on every trajectory — what a domain's circuit breaker must stop at once (test_broken_domain.py)."""

from __future__ import annotations

from openai import AsyncOpenAI


async def run(base_url: str, api_key: str, task) -> float:  # noqa: ANN001
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=task.model, messages=[{"role": "user", "content": f"Puzzle {task.seed}"}], n=64)
    return 1.0 if "42" in (reply.choices[0].message.content or "") else 0.0
