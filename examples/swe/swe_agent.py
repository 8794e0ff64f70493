"""A coding agent for rollart's SWE repair domain, written only against the `openai` package — the loop
users write: ask the model, run the tool it calls, send the result back, until it submits.

    domains:
      swe_agent: {agent: swe_agent:run, demonstrations: swe_agent:demonstration, options: {difficulty: 0}}

The workspace (a sandboxed checkout of a generated package with a seeded bug) is the env plane's
`SweEnv`, made here per trajectory and closed at the end, whatever happens; the reward is what `submit`
scored with the hidden tests. A reply without a tool call (or a malformed one) is a turn with a format
penalty, told to the model, not a crash. The same function runs against any OpenAI-compatible server.
"""

from __future__ import annotations

import asyncio
import json

from openai import AsyncOpenAI

from rollart.envs.domains.swe.env import SweEnv
from rollart.envs.domains.swe.expert import expert_patch
from rollart.envs.domains.swe.tools import TOOLS

FORMAT_PENALTY = -0.1


def make_env(options: dict) -> SweEnv:
    return SweEnv(**{k: v for k, v in options.items() if k != "max_calls"})


async def run(base_url: str, api_key: str, task) -> dict:
    env = make_env(dict(task.options))
    try:
        observation, _ = await asyncio.to_thread(env.reset, task.seed)
        messages = [{"role": "user", "content": observation}]
        reward, malformed, calls = 0.0, 0, 0
        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            for _ in range(int(task.options.get("max_calls", 4))):
                response = await client.chat.completions.create(model=task.model, messages=messages,
                                                                tools=list(TOOLS), max_tokens=256)
                message = response.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    malformed += 1
                    reward += FORMAT_PENALTY
                    messages.append({"role": "user", "content": "Call one of the tools."})
                    continue
                call = message.tool_calls[0]
                calls += 1
                try:
                    arguments = json.loads(call.function.arguments)
                except ValueError:
                    arguments = None
                text, step_reward, done, _, info = await asyncio.to_thread(env.call_tool, call.function.name,
                                                                           arguments)
                if info.get("format_error"):
                    malformed += 1
                    step_reward = FORMAT_PENALTY
                reward += step_reward
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
                if done:
                    break
        return {"reward": reward, "metrics": {"tool_calls": calls, "malformed": malformed,
                                              "solved": float(env.score is not None and env.score.reward == 1.0)}}
    finally:
        await asyncio.to_thread(env.close)


def demonstration(task, expert: bool) -> dict:
    """The expert's conversation on the same task (apply its patch, then submit), for the warm start."""
    env = make_env(dict(task.options))
    try:
        observation, _ = env.reset(task.seed)
        patch = {"id": "call_0", "type": "function",
                 "function": {"name": "apply_patch", "arguments": json.dumps({"patch": expert_patch(env.task)})}}
        submit = {"id": "call_1", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
        return {"messages": [
            {"role": "user", "content": observation},
            {"role": "assistant", "content": None, "tool_calls": [patch]},
            {"role": "tool", "tool_call_id": "call_0", "content": f"patched {env.task.bug.path}"},
            {"role": "assistant", "content": None, "tool_calls": [submit]},
        ], "tools": list(TOOLS)}
    finally:
        env.close()
