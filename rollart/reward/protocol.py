"""The reward protocol: what a reward function receives and returns, and the JSON payload remote backends get.

A reward function scores one finished `rollart.types.Trajectory`:

    def my_reward(trajectory: Trajectory) -> float | RewardOutput          # sync: run in a thread
    async def my_reward(trajectory: Trajectory) -> float | RewardOutput    # async: awaited
    class MyReward:                                                          # a class is instantiated once
        def __call__(self, trajectory: Trajectory) -> float | RewardOutput  # (no arguments), then called

`RewardOutput.per_turn` optionally scores each turn (one float per turn). Users name the function in config
(`domains.<d>.reward.fn`: `env`, `math`, `code`, `format`, `judge` or `module.path:callable`, see
`registry.py`).

What a reward function may read (the same on every backend):
- `trajectory.turns[i].observation / .action / .reward / .format_ok / .finish_reason` — the text of the
  episode; the final answer is the last turn's action (`final_action`), answers written as `\\boxed{...}`.
- `trajectory.reference` — from the environment's reset info. Keys the built-ins read (agreed with the env
  plane): `answer` (math: the gold answer, a string or number), `tests` (code: a test program as one string,
  or a list of test snippets, each run on its own), `entry_point` (code: the function name a HumanEval-style
  `check(candidate)` in the tests is called with), `language` (code: only "python"), `question` (judge:
  the question; else the first observation is used). The env plane's built-in `math` and `code` domains
  write exactly these (`{"answer": "42"}`; `{"entry_point": "f", "tests": ["assert f(1) == 3", ...],
  "language": "python"}`).
- `trajectory.task`, `.status`, `.env_return`, `.start_version`, `.trajectory_id`.
Token ids, logprobs and versions are NOT sent to remote backends: there a reward function sees the same
trajectory with empty token tuples.

Payload (JSON, `v` = 1), built by `to_payload` and read back by `parse_payload`, strictly: exact JSON types
(a string is never a number, `true` is never 1), finite numbers, 64-bit ints, ids of at most 512
characters, no unknown keys, text that is valid Unicode (no lone surrogates); anything else is a
`PayloadError` naming the field (HTTP 422):
    {"v": 1, "trajectory_id": str, "domain": str, "fn": str,
     "task": {"task_id", "env", "seed", "group_id", "split"}, "start_version": int,
     "status": str | null, "status_reason": str, "env_return": float, "reference": {...},
     "turns": [{"observation", "action", "reward", "format_ok", "finish_reason"}, ...]}
Answer (200): {"trajectory_id", "reward": float, "per_turn": [float] | null, "details": {...},
     "replayed": bool, "cold_start": bool, "replica": str, "score_s": float}
Errors: {"error": message, "code": one of unauthorized | payload_too_large | bad_request | conflict |
     reward_failed | reward_unavailable | busy | internal | not_found, "field": what was wrong (when known)},
     with HTTP 401 / 413 / 400 or 422 / 409 / 500 / 501 / 503 / 500 / 404. Every malformed request is a 4xx.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollart.base.untrusted import matching_braces
from rollart.types import Status, Task, Trajectory, Turn

PAYLOAD_VERSION = 1


@dataclass(frozen=True)
class RewardOutput:
    """A reward function's full answer: the score, optional per-turn scores, and free-form details."""

    reward: float
    per_turn: tuple[float, ...] | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


RewardValue = Union[float, int, bool, RewardOutput]
RewardFn = Callable[[Trajectory], Union[RewardValue, Awaitable[RewardValue]]]


class PayloadError(ValueError):
    """A reward request whose JSON does not follow the payload above; the message and `field` name the field."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class RewardInputError(ValueError):
    """A trajectory a reward fn cannot score because of what it holds (e.g. no `reference['answer']`): the
    request's fault, so retrying cannot help (HTTP 422 from the service; FAILED locally)."""


def final_action(trajectory: Trajectory) -> str:
    """The final answer text: the last turn's action ('' for a trajectory with no turns)."""
    return trajectory.turns[-1].action if trajectory.turns else ""


_BOXED = re.compile(r"\\boxed\s*\{")


def boxed_contents(text: str) -> list[str]:
    """Every `\\boxed{...}` body in `text`, braces balanced (nested braces are kept inside the body). Linear in
    the text: braces are matched in one pass, not scanned for again from every opening."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return []
    closes = matching_braces(text)
    return [text[m.end() : closes[m.end() - 1]] for m in matches if m.end() - 1 in closes]


def to_payload(trajectory: Trajectory, fn: str) -> dict[str, Any]:
    """The JSON-able request body for one trajectory (what scoring needs; no token ids)."""
    t = trajectory.task
    return {
        "v": PAYLOAD_VERSION,
        "trajectory_id": trajectory.trajectory_id,
        "domain": t.domain,
        "fn": fn,
        "task": {"task_id": t.trajectory_id,  # the wire keeps its name "task_id"
                  "env": t.env, "seed": t.seed, "group_id": t.group_id, "split": t.split},
        "start_version": trajectory.start_version,
        "status": trajectory.status.value if trajectory.status else None,
        "status_reason": trajectory.status_reason,
        "env_return": trajectory.env_return,
        "reference": dict(trajectory.reference),
        "turns": [
            {
                "observation": u.observation,
                "action": u.action,
                "reward": u.reward,
                "format_ok": u.format_ok,
                "finish_reason": u.finish_reason,
            }
            for u in trajectory.turns
        ],
    }


_INT64 = 2**63 - 1


class _Strict(BaseModel):
    """Payload parts: exact JSON types (no "1" for 1, no true for 1), finite floats, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class _TurnPayload(_Strict):
    observation: str = ""
    action: str
    reward: float = 0.0
    format_ok: bool = True
    finish_reason: Literal["stop", "length", "abort"] = "stop"


class _TaskPayload(_Strict):
    task_id: str | None = Field(None, max_length=512)
    env: str = Field("", max_length=512)
    seed: int = Field(0, ge=-_INT64, le=_INT64)
    group_id: str = Field("", max_length=512)
    split: Literal["train", "val"] = "train"


class _Payload(_Strict):
    v: int  # strict: 1.0 and true are not 1 (a Literal[1] would take them)
    trajectory_id: str = Field(min_length=1, max_length=512)
    domain: str = Field(max_length=256)
    fn: str | None = Field(None, max_length=512)
    task: _TaskPayload
    start_version: int = Field(0, ge=0, le=_INT64)
    status: Literal[tuple(s.value for s in Status)] | None = None  # type: ignore[valid-type]
    status_reason: str = ""
    env_return: float = 0.0
    reference: dict[str, Any] = Field(default_factory=dict)
    turns: list[_TurnPayload]

    @field_validator("v")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != PAYLOAD_VERSION:
            raise ValueError(f"payload version {PAYLOAD_VERSION} expected")
        return v


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _invalid_text(payload: Any) -> PayloadError | None:
    """A string (key or value) in parsed JSON that is not valid text — JSON's `\\ud800` escapes
    decode to lone surrogates, which no reward function can encode — as a PayloadError naming it."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), payload)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append(((*loc, key), key))
                stack.append(((*loc, key), item))
        elif isinstance(value, list):
            stack.extend(((*loc, i), item) for i, item in enumerate(value))
        elif isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                where = _field_path(loc)
                return PayloadError(f"{where}: not valid text ({exc.reason}: {exc.object[exc.start:exc.end]!r} at "
                                    f"character {exc.start})", where)
    return None


def parse_payload(payload: Any) -> tuple[Trajectory, str | None]:
    """The trajectory a remote reward function scores (token tuples empty) and the payload's `fn`.
    Raises `PayloadError` naming the first bad field and what would be valid (text that is not valid
    Unicode, e.g. a lone surrogate, included)."""
    if not isinstance(payload, dict):
        raise PayloadError(f"body: expected a JSON object, got {type(payload).__name__}", "body")
    bad_text = _invalid_text(payload)
    if bad_text is not None:
        raise bad_text
    try:
        p = _Payload.model_validate(payload)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = _field_path(err["loc"])
        got = "" if err["type"] in ("missing", "extra_forbidden") else f" (got {type(err['input']).__name__} " \
            f"{repr(err['input'])[:60]})"
        raise PayloadError(f"{where}: {err['msg']}{got}", where) from None
    trajectory_id = p.trajectory_id
    turns = tuple(
        Turn((), (), (), (), observation=u.observation, action=u.action, reward=u.reward,
             finish_reason=u.finish_reason, format_ok=u.format_ok)
        for u in p.turns
    )
    task = Task(p.task.task_id or trajectory_id, p.domain, p.task.env, p.task.seed, p.task.group_id, p.task.split)
    return Trajectory(
        trajectory_id=trajectory_id, task=task, start_version=p.start_version, turns=turns,
        status=Status(p.status) if p.status is not None else None, status_reason=p.status_reason,
        env_return=p.env_return, reference=p.reference,
    ), p.fn


def trajectory_from_payload(payload: Any) -> Trajectory:
    """The trajectory of a payload (see `parse_payload`)."""
    return parse_payload(payload)[0]


def normalise(value: Any, trajectory: Trajectory, fn_name: str) -> RewardOutput:
    """A reward function's return value as a checked RewardOutput (finite reward, one score per turn)."""
    if isinstance(value, RewardOutput):
        out = value
    elif isinstance(value, (int, float, bool)):
        out = RewardOutput(float(value))
    else:
        raise TypeError(
            f"reward function {fn_name} returned {type(value).__name__}; expected a float or a RewardOutput"
        )
    if not math.isfinite(out.reward):
        raise ValueError(f"reward function {fn_name} returned a non-finite reward {out.reward!r}")
    if out.per_turn is not None and len(out.per_turn) != len(trajectory.turns):
        raise ValueError(
            f"reward function {fn_name} returned {len(out.per_turn)} per-turn scores for "
            f"{len(trajectory.turns)} turn{'s' * (len(trajectory.turns) != 1)}"
        )
    return RewardOutput(float(out.reward), out.per_turn and tuple(float(x) for x in out.per_turn), out.details)


def is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


async def call_reward(fn: RewardFn, trajectory: Trajectory, fn_name: str = "") -> RewardOutput:
    """Run a sync (in a worker thread, so the event loop never blocks) or async reward function."""
    name = fn_name or getattr(fn, "__name__", type(fn).__name__)
    if is_async(fn):
        value = await fn(trajectory)
    else:
        value = await asyncio.to_thread(fn, trajectory)
        if inspect.isawaitable(value):
            value = await value
    return normalise(value, trajectory, name)
