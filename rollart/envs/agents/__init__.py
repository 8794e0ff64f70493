"""Agent domains: train any program written against an OpenAI-compatible client.

An agent trajectory is to the scheduler what an env trajectory is: the env worker runs an `AgentManager`
(the `EnvManager` contract: run / cancel / progress) that calls the user's function with the base URL and
key of its own gateway session, and the `AgentGateway` turns each model call into a `Turn` with exactly the
engine's tokens (see session.py for the prefix property and segments).

- `gateway.py` — the HTTP server (routes, keys, limits, errors in each protocol's shape); `http.py` its streams.
- `calls.py` — one model call on a session, whatever the protocol (plan → generate → parse → record);
  `call.py` — what a codec asks (`ChatCall`) and gets back (`CallOutput`).
- Protocol codecs onto the one session: `requests.py` + `responses.py` (OpenAI chat completions and
  completions), `openai_responses.py` (OpenAI Responses), `anthropic_messages.py` (Anthropic Messages).
- `session.py` — one trajectory's calls: prompt ids, segments, turns.
- `messages.py` — OpenAI messages/tools → template messages (the output parsers per family are the env
  plane's `rollart/envs/tool_calls/`, one module per model family, shared with the SWE domain).
- `function.py` — the agent function, `AgentTask`, what it may return; `manager.py` — `AgentManager`.
- `demonstrations.py` — warm-start samples from an agent domain's demonstrations.
"""

from rollart.envs.agents.demonstrations import demonstrate_agent, demonstration_sample
from rollart.envs.agents.function import AgentOutcome, AgentSpecError, AgentTask, agent_outcome, resolve_agent
from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.manager import AgentManager
from rollart.envs.agents.session import AgentSession, CallPlan, SessionLimits

__all__ = [
    "AgentGateway",
    "AgentOutcome",
    "AgentManager",
    "AgentSession",
    "AgentSpecError",
    "AgentTask",
    "CallPlan",
    "SessionLimits",
    "agent_outcome",
    "demonstrate_agent",
    "demonstration_sample",
    "resolve_agent",
]
