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

Payload (JSON, `v` = 1), built by `to_payload` and read back by `trajectory_from_payload`:
    {"v": 1, "trajectory_id": str, "domain": str, "fn": str,
     "task": {"task_id", "env", "seed", "group_id", "split"}, "start_version": int,
     "status": str | null, "status_reason": str, "env_return": float, "reference": {...},
     "turns": [{"observation", "action", "reward", "format_ok", "finish_reason"}, ...]}
Answer (200): {"trajectory_id", "reward": float, "per_turn": [float] | null, "details": {...},
     "replayed": bool, "cold_start": bool, "replica": str, "score_s": float}
Errors: {"error": message, "code": one of unauthorized | payload_too_large | bad_request | reward_failed |
     reward_unavailable | busy | not_found}, with HTTP 401 / 413 / 400 or 422 / 500 / 501 / 503 / 404.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Union

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
    """A reward request whose JSON does not follow the payload above; the message names the field."""


class RewardInputError(ValueError):
    """A trajectory a reward fn cannot score because of what it holds (e.g. no `reference['answer']`): the
    request's fault, so retrying cannot help (HTTP 422 from the service; FAILED locally)."""


def final_action(trajectory: Trajectory) -> str:
    """The final answer text: the last turn's action ('' for a trajectory with no turns)."""
    return trajectory.turns[-1].action if trajectory.turns else ""


_BOXED = re.compile(r"\\boxed\s*\{")


def boxed_contents(text: str) -> list[str]:
    """Every `\\boxed{...}` body in `text`, braces balanced (nested braces are kept inside the body)."""
    out: list[str] = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


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


def _get(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise PayloadError(f"{where}{key}: missing")
    value = d[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        names = "/".join(k.__name__ for k in _as_tuple(kind))
        raise PayloadError(f"{where}{key}: expected {names}, got {type(value).__name__} {value!r:.60}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def trajectory_from_payload(payload: Any) -> Trajectory:
    """Rebuild the trajectory a remote reward function scores (token tuples empty). Raises PayloadError."""
    if not isinstance(payload, dict):
        raise PayloadError(f"body: expected a JSON object, got {type(payload).__name__}")
    if payload.get("v") != PAYLOAD_VERSION:
        raise PayloadError(f"v: expected {PAYLOAD_VERSION}, got {payload.get('v')!r}")
    trajectory_id = _get(payload, "trajectory_id", str, "")
    if not trajectory_id:
        raise PayloadError("trajectory_id: must not be empty")
    domain = _get(payload, "domain", str, "")
    task = _get(payload, "task", dict, "")
    split = task.get("split", "train")
    if split not in ("train", "val"):
        raise PayloadError(f"task.split: expected 'train' or 'val', got {split!r}")
    status_raw = payload.get("status")
    try:
        status = Status(status_raw) if status_raw is not None else None
    except ValueError:
        raise PayloadError(f"status: {status_raw!r} is not one of {[s.value for s in Status]}") from None
    turns = []
    for i, u in enumerate(_get(payload, "turns", list, "")):
        if not isinstance(u, dict):
            raise PayloadError(f"turns[{i}]: expected an object")
        finish = u.get("finish_reason", "stop")
        if finish not in ("stop", "length", "abort"):
            raise PayloadError(f"turns[{i}].finish_reason: {finish!r} is not stop/length/abort")
        turns.append(
            Turn(
                prompt_token_ids=(),
                response_token_ids=(),
                logprobs=(),
                versions=(),
                observation=str(u.get("observation", "")),
                action=_get(u, "action", str, f"turns[{i}]."),
                reward=float(_get(u, "reward", (int, float), f"turns[{i}].")) if "reward" in u else 0.0,
                finish_reason=finish,
                format_ok=bool(u.get("format_ok", True)),
            )
        )
    reference = payload.get("reference", {})
    if not isinstance(reference, dict):
        raise PayloadError(f"reference: expected an object, got {type(reference).__name__}")
    return Trajectory(
        trajectory_id=trajectory_id,
        task=Task(
            trajectory_id=str(task.get("task_id", trajectory_id)),
            domain=domain,
            env=str(task.get("env", "")),
            seed=int(task.get("seed", 0)),
            group_id=str(task.get("group_id", "")),
            split=split,
        ),
        start_version=int(payload.get("start_version", 0)),
        turns=tuple(turns),
        status=status,
        status_reason=str(payload.get("status_reason", "")),
        env_return=float(payload.get("env_return", 0.0)),
        reference=reference,
    )


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
            f"{len(trajectory.turns)} turns"
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
