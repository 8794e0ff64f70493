"""AgentManager (one agent trajectory) and agent-domain warm-start samples, with the example agents and the
real `openai` client through a started gateway, against a scripted LLM client."""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path

import pytest

from rollart.config import DomainConfig, DomainRewardConfig
from rollart.envs.agents.demonstrations import demonstrate_agent, demonstration_sample
from rollart.envs.agents.function import AgentSpecError, agent_outcome, resolve_agent
from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.manager import AgentManager
from rollart.envs.chat import ChatTokens
from rollart.envs.seeds import episode_seed
from rollart.models.tiny import build_tokenizer
from rollart.trainer.sft_data import conversation_sample
from rollart.types import SamplingParams, Status, Task
from tests.unit.envs_fakes import ScriptedLLM

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"
sys.path.insert(0, str(EXAMPLES))
import calculator_agent  # noqa: E402


@pytest.fixture(scope="module")
def chat() -> ChatTokens:
    return ChatTokens(build_tokenizer(tool_calls=True))


CALC = DomainConfig(agent="calculator_agent:run", demonstrations="calculator_agent:demonstration", max_turns=3)


def calc_replies(task: Task) -> list[str]:
    _, answer, expression = calculator_agent.problem(episode_seed(task), {})
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>' % expression
    return [call, "\\boxed{%d}" % answer]


def run_agent(chat, agent, replies, domain=CALC, task=None, *, delay_s=0.0, fail_on_turn=None, cancel_after=None):
    task = task or Task("g0/0", "calc", "", 5, "g0")
    llm = ScriptedLLM(chat.tokenizer, replies, delay_s=delay_s, fail_on_turn=fail_on_turn)
    gateway = AgentGateway(llm, chat).start()
    runner = AgentManager(task, 0, agent=agent, domain_cfg=domain, gateway=gateway,
                         sampling=SamplingParams(max_new_tokens=40, stop_token_ids=chat.stop_token_ids))

    async def scenario():
        running = asyncio.ensure_future(runner.run())
        if cancel_after is not None:  # once the agent's first call is generating, and `cancel_after` later
            for _ in range(2000):
                if llm.requests:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(cancel_after)
            await runner.cancel(Status.STALE, "too old")
        return await asyncio.wait_for(running, 30)

    try:
        return asyncio.run(scenario()), llm, gateway
    finally:
        gateway.stop()


def test_the_calculator_agent_completes_with_its_reward_and_two_turns(chat):
    task = Task("g0/0", "calc", "", 5, "g0")
    traj, llm, gateway = run_agent(chat, calculator_agent.run, calc_replies(task), task=task)
    assert traj.status == Status.COMPLETED and traj.env_return == 1.0
    assert len(traj.turns) == 2 and traj.turns[0].format_ok
    assert [r.prompt_token_ids for r in llm.requests][1][: len(llm.requests[0].prompt_token_ids)] == \
        llm.requests[0].prompt_token_ids
    names = [s.name for t in traj.turns for s in t.spans] + [s.name for s in traj.spans]
    assert names.count("agent.step") == 3 and names.count("generate.wait") == 2
    assert traj.metrics["calls"] == 2 and traj.metrics["malformed_tool_calls"] == 0
    assert gateway.open_sessions == 0


def test_a_wrong_answer_scores_zero_and_a_malformed_call_is_counted(chat):
    traj, _, _ = run_agent(chat, calculator_agent.run, ['<tool_call>{"name": calculator}</tool_call>'])
    assert traj.status == Status.COMPLETED and traj.env_return == 0.0
    assert traj.metrics["malformed_tool_calls"] == 1 and not traj.turns[0].format_ok


async def raising_agent(base_url, api_key, task):
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "x"}])
    raise RuntimeError("tool crashed")


async def looping_agent(base_url, api_key, task):
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        for i in range(100):
            await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": str(i)}])
    return 1.0


async def silent_agent(base_url, api_key, task):
    return 1.0


def sync_agent(base_url, api_key, task):  # a plain def with the sync client: run in a thread
    from openai import OpenAI

    reply = OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
        model=task.model, messages=[{"role": "user", "content": "hi"}])
    return {"reward": 0.5, "reference": {"answer": reply.choices[0].message.content}, "metrics": {"tools": 0, "calls": 7}}


async def sleepy_agent(base_url, api_key, task):
    await asyncio.sleep(60)


@pytest.mark.parametrize(
    "agent, domain, status, reason",
    [
        (raising_agent, CALC, Status.FAILED, "agent raised RuntimeError: tool crashed"),
        (looping_agent, CALC, Status.TRUNCATED, "max_turns (3) reached"),
        (silent_agent, CALC, Status.FAILED, "the agent made no model call"),
        (sleepy_agent, CALC.model_copy(update={"agent_timeout_s": 0.5}), Status.FAILED, "agent timed out after 0.5s"),
        (lambda b, k, t: "yes", CALC, Status.FAILED, "the agent returned str"),
    ],
)
def test_agent_endings_map_onto_trajectory_statuses(chat, agent, domain, status, reason):
    traj, _, gateway = run_agent(chat, agent, ["ok"], domain=domain)
    assert traj.status == status and traj.status_reason.startswith(reason), traj.status_reason
    assert gateway.open_sessions == 0


def test_a_sync_agent_and_a_dict_outcome(chat):
    traj, _, _ = run_agent(chat, sync_agent, ["hello"])
    assert traj.status == Status.COMPLETED and traj.env_return == 0.5
    assert traj.reference == {"answer": "hello"} and traj.metrics["agent/tools"] == 0
    # the agent's own numbers are namespaced: its "calls" cannot overwrite the runner's count of model calls
    assert traj.metrics["agent/calls"] == 7 and traj.metrics["calls"] == 1


def test_no_reward_on_an_env_scored_domain_fails_but_a_reward_domain_scores_it(chat):
    async def reference_only(base_url, api_key, task):
        return sync_agent(base_url, api_key, task) | {"reward": None}

    traj, _, _ = run_agent(chat, reference_only, ["x"])
    assert traj.status == Status.FAILED and "no reward" in traj.status_reason
    traj, _, _ = run_agent(chat, reference_only, ["x"], domain=CALC.model_copy(update={"reward": DomainRewardConfig(fn="math")}))
    assert traj.status == Status.COMPLETED


def test_a_failed_generation_fails_the_trajectory_even_if_the_agent_swallows_it(chat):
    async def swallowing(base_url, api_key, task):
        try:
            await raising_agent(base_url, api_key, task)
        except Exception:
            return 1.0

    traj, _, _ = run_agent(chat, swallowing, ["x"], fail_on_turn=0)
    assert traj.status == Status.FAILED and "inference worker died" in traj.status_reason


def test_cancel_stops_the_agent_and_keeps_the_aborted_turn(chat):
    traj, llm, gateway = run_agent(chat, looping_agent, ["a long answer"], delay_s=30, cancel_after=0.2)
    assert traj.status == Status.STALE and traj.status_reason == "too old"
    assert llm.aborted == ["g0/0"] and traj.turns[-1].finish_reason == "abort"
    assert len(llm.requests) == 1  # the agent made no call after the cancel


def test_agent_specs_and_outcomes_are_checked():
    with pytest.raises(AgentSpecError, match="must take 3 positional"):
        resolve_agent("calculator_agent:problem")
    with pytest.raises(AgentSpecError, match="cannot import"):
        resolve_agent("no_such_module:run")
    with pytest.raises(AgentSpecError, match="expected"):
        resolve_agent("calculator_agent")
    assert agent_outcome(True).reward == 1.0
    with pytest.raises(TypeError, match="unknown keys"):
        agent_outcome({"score": 1})
    with pytest.raises(TypeError, match="finite"):
        agent_outcome(float("nan"))
    with pytest.raises(TypeError, match="metric name 'a/b'"):
        agent_outcome({"metrics": {"a/b": 1}})


def test_a_demonstration_is_laid_out_exactly_as_the_rollout_of_the_same_seed(chat):
    task = Task("demo/calc/train/5", "calc", "", 5, "demo")
    rollout, _, _ = run_agent(chat, calculator_agent.run, calc_replies(task), task=task)
    sample = demonstrate_agent("calc", CALC, chat, 5, expert_prob=1.0)
    assert list(sample.token_ids) == rollout.token_ids() and list(sample.loss_mask) == rollout.loss_mask()
    # without tools, the layout of the trainer's own conversation samples (what env warm starts use)
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "bye"}, {"role": "assistant", "content": "ok"}]
    ours = demonstration_sample(chat, {"messages": conversation}, "d")
    theirs = conversation_sample(chat.tokenizer, conversation)
    n = len(ours.token_ids)  # theirs also holds the template's newline after the last message (masked out)
    assert (ours.token_ids, ours.loss_mask) == (theirs.token_ids[:n], theirs.loss_mask[:n])
    assert not any(theirs.loss_mask[n:])
    with pytest.raises(ValueError, match="no assistant message"):
        demonstration_sample(chat, {"messages": conversation[:1]}, "bad")


def test_an_agent_that_errs_after_it_was_cancelled_leaves_no_unretrieved_exception(chat):
    """An agent that answers its cancellation (here: a timeout) with an error of its own: that error is read,
    so asyncio never logs "Task exception was never retrieved" for it."""
    async def stubborn(base_url, api_key, task):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    domain = CALC.model_copy(update={"agent_timeout_s": 0.3})
    task = Task("g0/0", "calc", "", 5, "g0")
    gateway = AgentGateway(ScriptedLLM(chat.tokenizer, ["x"]), chat).start()
    unretrieved: list[str] = []

    async def scenario():
        # only this agent's own error counts: in the full suite, tasks other tests left behind (Ray's, SDKs')
        # may be collected by the gc.collect() below too
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: unretrieved.append(context["message"])
            if "cleanup failed" in repr(context.get("exception")) else None)
        manager = AgentManager(task, 0, agent=stubborn, domain_cfg=domain, gateway=gateway,
                               sampling=SamplingParams(max_new_tokens=8, stop_token_ids=chat.stop_token_ids))
        traj = await manager.run()
        del manager
        gc.collect()  # an unretrieved exception is reported when its task is collected
        await asyncio.sleep(0)
        return traj

    try:
        traj = asyncio.run(scenario())
    finally:
        gateway.stop()
    assert traj.status == Status.FAILED and traj.status_reason.startswith("agent timed out after 0.3s")
    assert unretrieved == []
