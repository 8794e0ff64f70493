"""Expert conversations of an agent domain → supervised warm-start samples laid out exactly as a rollout.

In: `domains.<name>.demonstrations: module.path:function`, called as `demo(task, expert)` with an
`AgentTask` (a train seed) and whether to demonstrate the expert (else a well-formed but naive attempt: the
warm start then teaches the format more than the task, `train.warm_start.expert_prob`), returning
`{"messages": [...], "tools": [...]}` — the conversation the agent would have, in OpenAI's format (assistant messages with `content` and/or `tool_calls`, tool results as `tool`
messages). Out: a `TrainSample` whose ids are what the gateway would have fed and sampled: each assistant
message is one call, its prompt planned by the gateway's own `AgentSession` (so the layout — prefix
extension, closing tokens, tool results — is the rollout's by construction) and its response the ids of
the text the template renders for that message plus the end-of-message token; the loss mask covers the
responses.

Errors name the demonstration: a conversation that is not one segment (it rewrites its own history), an
assistant message the template cannot render as a continuation, or no assistant message at all.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping

from rollart.config import DomainConfig
from rollart.envs.agents.function import AgentTask, resolve_agent
from rollart.envs.agents.messages import template_messages, template_tools
from rollart.envs.agents.session import AgentSession, SessionLimits
from rollart.envs.chat import ChatTokens
from rollart.envs.seeds import episode_seed
from rollart.types import GenerationResult, Status, Task, TrainSample, Trajectory

MAX_DEMO_MESSAGES = 4096


def resolve_demonstrations(spec: str) -> Callable[[AgentTask, bool], Mapping[str, Any]]:
    return resolve_agent(spec, what="demonstrations", arity=2)


def demonstrate_agent(domain: str, domain_cfg: DomainConfig, chat: ChatTokens, seed: int, expert_prob: float = 1.0,
                      model: str = "rollart-policy") -> TrainSample:
    """One warm-start sample of an agent domain: its demonstration of train seed `seed`, the expert's with
    probability `expert_prob` (the same seed plays the same problem as a rollout of that seed)."""
    if not domain_cfg.demonstrations:
        raise ValueError(f"domain {domain!r} has no `demonstrations` to warm-start from")
    task = Task(f"demo/{domain}/train/{seed}", domain, "", seed, group_id="demo", split="train")
    agent_task = AgentTask(task.trajectory_id, domain, episode_seed(task), "train", dict(domain_cfg.options), model)
    expert = random.Random(f"demo:{seed}").random() < expert_prob
    return demonstration_sample(chat, resolve_demonstrations(domain_cfg.demonstrations)(agent_task, expert), task.trajectory_id)


def demonstration_sample(chat: ChatTokens, demo: Any, sample_id: str) -> TrainSample:
    if not isinstance(demo, Mapping) or "messages" not in demo:
        raise ValueError(f"demonstration {sample_id}: expected {{'messages': [...], 'tools': [...]}}, got "
                         f"{type(demo).__name__}")
    messages = template_messages(demo["messages"], MAX_DEMO_MESSAGES)
    tools = template_tools(demo.get("tools"), MAX_DEMO_MESSAGES)
    session = AgentSession(sample_id, "", chat, SessionLimits(len(messages), 10**9))
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        plan = session.plan_chat(messages[:k], tools)
        before = chat.render(messages[:k], True, tools)
        after = chat.render(messages[: k + 1], False, tools)
        if not (after.startswith(before) and after.endswith(chat.message_close)):
            raise ValueError(f"demonstration {sample_id}: the chat template does not render message {k} as a "
                             "continuation of the conversation before it")
        ids = chat.assistant_ids(after[len(before) : len(after) - len(chat.message_close)])
        n = len(ids)
        result = GenerationResult(f"{sample_id}/{k}", sample_id, tuple(ids), (0.0,) * n, (0,) * n, "stop")
        session.record(plan, result, action="", returned=message, malformed="", spans=())
    if not session.turns:
        raise ValueError(f"demonstration {sample_id}: no assistant message to train on")
    if any(t.segment for t in session.turns):
        raise ValueError(f"demonstration {sample_id}: its messages rewrite the conversation's history; a "
                         "demonstration must be one conversation that only grows")
    task = Task(sample_id, "sft", "", 0, sample_id)
    traj = Trajectory(sample_id, task, 0, turns=tuple(session.turns), status=Status.COMPLETED)
    n = len(traj.token_ids())
    return TrainSample(
        trajectory_id=sample_id, group_id=sample_id, domain="sft", token_ids=tuple(traj.token_ids()),
        loss_mask=tuple(traj.loss_mask()), behaviour_logprobs=(0.0,) * n, token_versions=(-1,) * n,
        advantage=0.0, reward=0.0,
    )
