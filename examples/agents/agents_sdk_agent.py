"""The calculator agent written with the OpenAI Agents SDK (`Runner.run`), trained by rollart unchanged:

    domains:
      calc: {agent: agents_sdk_agent:run}

The SDK talks the Responses API, which the gateway serves. Three things keep concurrent trajectories apart
and private (see the README's "Bring your own agent"): each agent gets its own client through its model (never
`set_default_openai_client`, which is process-wide), the function is `async` (`Runner.run_sync` in threads
trips over event loops), and tracing is off (it uploads every trajectory to OpenAI when OPENAI_API_KEY is set).
"""

from __future__ import annotations

from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

from calculator_agent import calculate, final_answer, problem


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (integers with + - *)."""
    return calculate(expression)


async def run(base_url: str, api_key: str, task) -> float:
    question, answer, _ = problem(task.seed, task.options)
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    agent = Agent(
        name="calculator",
        instructions="Use the calculator, then give the result as \\boxed{N}.",
        tools=[calculator],
        model=OpenAIResponsesModel(model=task.model, openai_client=client),
    )
    result = await Runner.run(agent, question, max_turns=int(task.options.get("max_calls", 3)),
                              run_config=RunConfig(tracing_disabled=True))
    return 1.0 if final_answer(result.final_output) == str(answer) else 0.0
