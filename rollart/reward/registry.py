"""Resolve a reward spec from config (`domains.<d>.reward.fn`) into a callable reward function.

In: a spec string and the `RunConfig`. Out: a `RewardFn` (see protocol.py).
- `env`, `format`, `exact`, `regex` — rule rewards (rule_rewards.py);
- `math` — math-verify in a process pool (math_reward.py);
- `code` — program + hidden tests in the sandbox (code_reward.py);
- `judge` — a local checkpoint scores yes/no (judge_reward.py);
- `module.path:callable` — a user function or class (a class is instantiated once with no arguments) of the
  trajectory; or, with parameters named `response` and `row`, of the last action's text and the dataset row
  the episode was made from (`trajectory.reference["row"]`: role → value), called by keyword.
Built-ins are made once per `RewardFns` (they hold process pools or a model), lazily on first use.

An unknown built-in or a path that does not import fails with a ValueError that names the spec, the
domain and what would be valid.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys

from rollart.config import RunConfig
from rollart.reward.protocol import RewardFn
from rollart.types import Trajectory

log = logging.getLogger("rollart.reward")

BUILTINS = ("env", "format", "math", "code", "judge", "exact", "regex")
ROW_PARAMETERS = ("response", "row")


def _make_builtin(name: str, cfg: RunConfig) -> RewardFn:
    if name == "env":
        from rollart.reward.rule_rewards import env_reward

        return env_reward
    if name == "format":
        from rollart.reward.rule_rewards import format_reward

        return format_reward
    if name == "exact":
        from rollart.reward.rule_rewards import exact_reward

        return exact_reward
    if name == "regex":
        from rollart.reward.rule_rewards import RegexReward

        return RegexReward({d: c.reward.pattern for d, c in cfg.domains.items() if c.reward.fn == "regex"})
    if name == "math":
        from rollart.reward.math_reward import MathReward

        return MathReward(cfg.reward.math_timeout_s, cfg.reward.math_workers)
    if name == "code":
        from rollart.reward.code_reward import CodeReward

        return CodeReward(cfg.reward.sandbox)
    if name == "judge":
        from rollart.models import resolve_model_path
        from rollart.reward.judge_reward import JudgeReward

        model = cfg.model.model_copy(update={"path": cfg.reward.judge_model, "revision": "", "adapter": ""}) \
            if cfg.reward.judge_model else cfg.model
        return JudgeReward(resolve_model_path(model, seed=cfg.seed, key="reward.judge_model"), model.dtype,
                           trust_remote_code=model.trust_remote_code)
    raise AssertionError(name)


def _target(spec: str) -> object:
    """The object `module.path:callable` names (imported, not called; the current directory importable)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward fn {spec!r}: expected a built-in {list(BUILTINS)} or 'module.path:callable'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"reward fn {spec!r} cannot be loaded: {exc}") from exc
    if not callable(obj):
        raise ValueError(f"reward fn {spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def import_reward(spec: str) -> RewardFn:
    """`module.path:callable` → the callable (a class is instantiated with no arguments); one of `response` and
    `row` (see the module docstring) is wrapped into a function of the trajectory."""
    obj = _target(spec)
    fn = obj() if inspect.isclass(obj) else obj
    return row_reward(fn) if takes_row(fn) else fn  # type: ignore[return-value]


def takes_row(fn: object) -> bool:
    """Whether a reward callable is one of the response text and the dataset row (parameters by name)."""
    try:
        names = set(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return set(ROW_PARAMETERS) <= names


def row_reward(fn: object) -> RewardFn:
    """A reward of the trajectory that calls `fn(response=<last action>, row=<reference['row']>)`."""
    from rollart.reward.protocol import RewardInputError, final_action, is_async

    name = getattr(fn, "__name__", type(fn).__name__)

    def arguments(trajectory: Trajectory) -> dict[str, object]:
        row = trajectory.reference.get("row")
        if not isinstance(row, dict):
            raise RewardInputError(f"reward fn {name} takes a dataset row, but trajectory {trajectory.trajectory_id} "
                                   "carries none (is its domain `env: dataset`?)")
        return {"response": final_action(trajectory), "row": row}

    if is_async(fn):
        async def score_row(trajectory: Trajectory) -> object:
            return await fn(**arguments(trajectory))  # type: ignore[operator]
    else:
        def score_row(trajectory: Trajectory) -> object:  # type: ignore[misc]
            return fn(**arguments(trajectory))  # type: ignore[operator]
    score_row.__name__ = name
    return score_row  # type: ignore[return-value]


def check_spec(spec: str, where: str, *, here: bool = True) -> None:
    """Fail early (before anything starts) on a spec that can never resolve: a built-in, or a
    `module.path:callable` that — when it runs `here` (backends local and serverless; an `http` service has
    its own) — imports (not instantiated)."""
    if spec in BUILTINS:
        return
    if ":" not in spec:
        raise ValueError(f"{where}: {spec!r} is not a built-in reward {list(BUILTINS)} nor 'module.path:callable'")
    if not here:
        return
    try:
        _target(spec)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


class RewardFns:
    """The reward functions of one process (the driver's, or one Serve replica's), made on first use."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._fns: dict[str, RewardFn] = {}

    def get(self, spec: str) -> RewardFn:
        if spec not in self._fns:
            if spec in BUILTINS:
                self._fns[spec] = _make_builtin(spec, self.cfg)
            else:
                self._fns[spec] = import_reward(spec)
        return self._fns[spec]

    def warm(self, specs: list[str]) -> None:
        """Make these fns now and let each warm up (`warm()`: start pools, load models), so the first
        request a process serves does not pay for it."""
        for spec in specs:
            try:
                warm = getattr(self.get(spec), "warm", None)
                if callable(warm):
                    warm()
            except Exception as exc:  # noqa: BLE001 — the error is reported by the requests that need it
                log.warning("reward fn %r failed to warm up: %s", spec, exc)

    def close(self) -> None:
        for fn in self._fns.values():
            close = getattr(fn, "close", None)
            if callable(close):
                close()
        self._fns.clear()
