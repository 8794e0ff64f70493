"""The user's agent: `domains.<name>.agent: module.path:function`, what it receives and what it returns.

In: the spec string (the current directory is importable, like env specs). The function is

    async def run(base_url: str, api_key: str, task) -> float | dict | None     (a plain `def` runs in a thread)

and talks to the model only through an OpenAI-compatible client at `base_url` with `api_key`. `task` is an
`AgentTask`: `trajectory_id`, `domain`, `seed` (the episode seed — train and validation seeds never overlap),
`split` ("train" | "val"), `options` (the domain's `options`) and `model` (a model name to send; any is
accepted).

Out (`agent_outcome`): a number is the trajectory's reward (`env_return`; the domain's default reward
`env` uses it). A dict may hold `reward` (a number), `reference` (a dict the domain's reward reads, e.g.
`{"answer": "42"}` for `reward: math`, which checks the last model output) and `metrics` (numbers under
names of letters, digits, `_.-`; kept on the trajectory as `agent/<name>` and logged per step as
`env/<domain>/agent/<name>`). `None` or a dict without `reward` leaves scoring to the domain's reward.
Anything else is an error naming what was returned.

Optional warm start: `domains.<name>.demonstrations: module.path:function` — `def demo(task, expert) ->
{"messages": [...], "tools": [...]}`, a conversation in OpenAI's format (see `demonstrations.py`).
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Union

from rollart.envs.adapters.user_object import import_user_object

AgentResult = Union[float, int, bool, Mapping[str, Any], None]
AgentFunction = Callable[[str, str, "AgentTask"], Union[AgentResult, Awaitable[AgentResult]]]

METRIC_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
ACCEPTED = "'module.path:function' naming async def run(base_url, api_key, task) (the current directory is importable)"


class AgentSpecError(ValueError):
    """An agent (or demonstrations) spec that names nothing usable."""


@dataclass(frozen=True)
class AgentTask:
    trajectory_id: str
    domain: str
    seed: int
    split: str
    options: Mapping[str, Any] = field(default_factory=dict)
    model: str = "rollart-policy"


@dataclass(frozen=True)
class AgentOutcome:
    reward: float | None = None
    reference: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)


def resolve_agent(spec: str, what: str = "agent", arity: int = 3) -> Callable[..., Any]:
    """The function `spec` names, checked to take `arity` positional arguments."""
    if ":" not in spec:
        raise AgentSpecError(f"{what} {spec!r}: expected {ACCEPTED}")
    fn = import_user_object(spec.strip(), what, ACCEPTED, AgentSpecError)
    try:
        inspect.signature(fn).bind(*range(arity))
    except TypeError:
        raise AgentSpecError(f"{what} {spec!r}: {getattr(fn, '__name__', fn)!r} must take {arity} positional "
                             f"argument(s), its signature is {inspect.signature(fn)}") from None
    return fn


def _metric_name(name: Any) -> str:
    # it becomes part of a logged metric name (env/<domain>/agent/<name>) and a TensorBoard tag
    if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
        raise TypeError(f"the agent's metric name {name!r} must be letters, digits, '_', '.' or '-' (1–64 of them)")
    return name


def _number(value: Any, where: str) -> float:
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    raise TypeError(f"{where} must be a finite number, got {type(value).__name__} {value!r:.60}")


def agent_outcome(value: Any) -> AgentOutcome:
    """What the agent function returned, checked (TypeError naming the problem)."""
    if value is None:
        return AgentOutcome()
    if isinstance(value, (bool, int, float)):
        return AgentOutcome(reward=_number(float(value), "the agent's reward"))
    if isinstance(value, Mapping):
        unknown = set(value) - {"reward", "reference", "metrics"}
        if unknown:
            raise TypeError(f"the agent returned a dict with unknown keys {sorted(unknown)}; "
                            "allowed: reward, reference, metrics")
        reward = value.get("reward")
        reference = value.get("reference") or {}
        metrics = value.get("metrics") or {}
        if not isinstance(reference, Mapping) or not isinstance(metrics, Mapping):
            raise TypeError("the agent's 'reference' and 'metrics' must be dicts")
        return AgentOutcome(
            reward=None if reward is None else _number(reward, "the agent's 'reward'"),
            reference=dict(reference),
            metrics={_metric_name(k): _number(v, f"the agent's metric {k!r}") for k, v in metrics.items()},
        )
    raise TypeError(f"the agent returned {type(value).__name__} {value!r:.60}; expected a number (the reward), "
                    "a dict (reward / reference / metrics) or None")
