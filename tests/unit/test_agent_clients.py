"""The client matrix: stock agents, each written as its framework's own docs write it, run through the gateway
unchanged — the OpenAI Agents SDK (`Runner.run`, Responses and chat models, `output_type`), LangChain
(`bind_tools`, `use_responses_api`, `with_structured_output`) and LangGraph's ReAct agent, smolagents'
`ToolCallingAgent` (which forces `tool_choice="required"`), LiteLLM (`completion`, `responses`). The
`openai` SDK's chat and Responses and the `anthropic` SDK are in test_agent_gateway.py / test_agent_protocols.py.

One gateway for the module over a scripted LLM client (what these tests are about is each SDK's requests and
how it reads the answers; constrained decoding on a real engine is test_agent_constrained.py). The installed
SDKs are the `agents` extra (`make test` installs it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os

import pydantic
import pytest

from rollart.envs.agents.session import SessionLimits
from rollart.envs.chat import ChatTokens
from rollart.models.tiny import build_tokenizer
from tests.unit.test_agent_gateway import Harness

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches a price list at import otherwise
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def call(name: str, **args) -> str:
    return CALL.format(name=name, args=json.dumps(args))


@pytest.fixture(scope="module")
def harness():
    h = Harness(ChatTokens(build_tokenizer(tool_calls=True)))
    yield h
    h.gateway.stop()


def session(harness: Harness, tid: str, replies: list[str]) -> tuple[str, str]:
    script = list(replies)
    harness.llm.reply = lambda request, k: script[min(k, len(script) - 1)]
    return harness.gateway.open(tid, domain="agent", limits=SessionLimits(8, 16384), sampling=harness.sampling)  # smolagents: a long system prompt


def turns(harness: Harness, tid: str):
    s, failure = asyncio.run(harness.gateway.finish(tid))
    assert not failure
    return s.turns


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class Verdict(pydantic.BaseModel):
    correct: bool
    value: int


@pytest.mark.parametrize("responses_api", [True, False])
def test_openai_agents_sdk_runner_run(harness, responses_api):
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    tid = f"oa/{responses_api}"
    base, key = session(harness, tid, [call("multiply", a=37, b=4), "It is 148."])
    client = AsyncOpenAI(base_url=base, api_key=key)  # per agent: never the process-wide default client
    model = (OpenAIResponsesModel if responses_api else OpenAIChatCompletionsModel)(model="m", openai_client=client)
    agent = Agent(name="calc", instructions="Use the tool.", tools=[function_tool(multiply)], model=model)
    result = asyncio.run(Runner.run(agent, "What is 37*4?", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == "It is 148."
    recorded = turns(harness, tid)
    assert len(recorded) == 2 and [t.segment for t in recorded] == [0, 0]  # one exact-token sequence
    assert "148" in harness.chat.tokenizer.decode(list(recorded[1].prompt_token_ids))  # the tool's result


def test_openai_agents_sdk_output_type(harness):
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner
    from openai import AsyncOpenAI

    base, key = session(harness, "oa/out", ['{"correct": true, "value": 148}'])
    agent = Agent(name="judge", instructions="Judge.", output_type=Verdict,
                  model=OpenAIResponsesModel(model="m", openai_client=AsyncOpenAI(base_url=base, api_key=key)))
    result = asyncio.run(Runner.run(agent, "Is 37*4 = 148?", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == Verdict(correct=True, value=148)
    sampled = harness.llm.requests[-1].sampling
    assert sampled.grammar and "%json" in sampled.grammar  # the schema went to the engine as a grammar
    turns(harness, "oa/out")


@pytest.mark.parametrize("responses_api", [False, True])
def test_langchain_bind_tools_and_structured_output(harness, responses_api):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    tid = f"lc/{responses_api}"
    base, key = session(harness, tid, [call("multiply", a=6, b=7), "42", '{"correct": true, "value": 42}'])
    llm = ChatOpenAI(model="m", base_url=base, api_key=key, use_responses_api=responses_api, max_retries=0)
    bound = llm.bind_tools([multiply], tool_choice="multiply")  # a named tool_choice
    messages = [HumanMessage("What is 6*7?")]
    ai = bound.invoke(messages)
    (tc,) = ai.tool_calls
    assert tc["name"] == "multiply" and tc["args"] == {"a": 6, "b": 7}
    messages += [ai, ToolMessage(str(multiply(**tc["args"])), tool_call_id=tc["id"])]
    assert llm.bind_tools([multiply]).invoke(messages).text == "42"
    assert llm.with_structured_output(Verdict).invoke("Is 6*7 = 42?") == Verdict(correct=True, value=42)
    recorded = turns(harness, tid)
    assert [t.segment for t in recorded] == [0, 0, 1]  # the structured call is a new conversation


def test_langgraph_react_agent(harness):
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    base, key = session(harness, "lg/0", [call("multiply", a=3, b=5), "15"])
    graph = create_react_agent(ChatOpenAI(model="m", base_url=base, api_key=key, max_retries=0), [multiply])
    out = graph.invoke({"messages": [("user", "What is 3*5?")]})
    assert out["messages"][-1].content == "15"
    assert [t.segment for t in turns(harness, "lg/0")] == [0, 0]


def test_smolagents_tool_calling_agent(harness):
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def product(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        """
        return a * b

    base, key = session(harness, "sa/0", [call("product", a=8, b=9), call("final_answer", answer="72")])
    agent = ToolCallingAgent(tools=[product], model=OpenAIServerModel(model_id="m", api_base=base, api_key=key),
                             max_steps=3, verbosity_level=0)
    assert str(agent.run("What is 8*9?")) == "72"
    assert harness.llm.requests[-1].sampling.grammar  # it sent tool_choice="required": a forced call
    assert len(turns(harness, "sa/0")) == 2


def test_litellm_completion_and_responses(harness):
    import litellm

    base, key = session(harness, "ll/0", [call("multiply", a=2, b=21), "Hello from the gateway."])
    tools = [{"type": "function", "function": {"name": "multiply", "description": "Multiply",
                                               "parameters": {"type": "object", "properties": {
                                                   "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    reply = litellm.completion(model="openai/m", api_base=base, api_key=key, tools=tools,
                               messages=[{"role": "user", "content": "What is 2*21?"}])
    (tc,) = reply.choices[0].message.tool_calls
    assert tc.function.name == "multiply" and json.loads(tc.function.arguments) == {"a": 2, "b": 21}
    answer = litellm.responses(model="openai/m", api_base=base, api_key=key, input="Say hello.")
    assert answer.output[0].content[0].text == "Hello from the gateway."
    turns(harness, "ll/0")


@pytest.mark.parametrize("example", ["calculator_agent", "agents_sdk_agent", "anthropic_agent"])
def test_the_examples_run_through_the_gateway(harness, example, monkeypatch):
    """examples/agents: the same calculator agent with the `openai` SDK, the Agents SDK and the `anthropic` SDK."""
    import importlib
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "agents"))
    module = importlib.import_module(example)
    task = SimpleNamespace(seed=3, options={"max_operand": 5}, model="m")
    question, answer, expression = sys.modules["calculator_agent"].problem(3, task.options)
    base, key = session(harness, f"ex/{example}", [call("calculator", expression=expression), f"\\boxed{{{answer}}}"])
    assert asyncio.run(module.run(base, key, task)) == 1.0
    recorded = turns(harness, f"ex/{example}")
    assert len(recorded) == 2 and [t.segment for t in recorded] == [0, 0]


def test_mini_swe_agent_repairs_in_the_trajectorys_own_workspace(harness, monkeypatch):
    """examples/swe/mini_swe_agent.py: mini-swe-agent's own DefaultAgent and LitellmModel, its commands run in the
    SWE domain's workspace sandbox; a scripted model plays the expert (write the fixed file, submit): the hidden
    tests score 1, and every call is a turn of one exact-token sequence."""
    import shlex
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from rollart.envs.domains.swe.generator import generate

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "swe"))
    import mini_swe_agent

    repair = generate(7, 0)
    path = repair.bug.path
    write = f"cat > {shlex.quote(path)} <<'ROLLART_EOF'\n{repair.fix[path]}ROLLART_EOF"
    saved = harness.sampling  # room for a whole file in one command
    harness.sampling = dataclasses.replace(saved, max_new_tokens=4096)
    try:
        base, key = session(harness, "mini/0", [call("bash", command=f"cat {shlex.quote(path)}"),
                                                call("bash", command=write),
                                                call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")])
    finally:
        harness.sampling = saved
    task = SimpleNamespace(seed=7, options={"difficulty": 0, "max_calls": 5}, model="m")
    outcome = mini_swe_agent.run(base, key, task)
    assert outcome["reward"] == 1.0 and outcome["metrics"]["submitted"] == 1.0
    recorded = turns(harness, "mini/0")
    assert len(recorded) == 3 and [t.segment for t in recorded] == [0, 0, 0]
    # the first command's output (the buggy file, read in the sandbox) went back to the model
    assert repair.files[path].splitlines()[0] in harness.chat.tokenizer.decode(list(recorded[1].prompt_token_ids))
    assert "minisweagent" in sys.modules
